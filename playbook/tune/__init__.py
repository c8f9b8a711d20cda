"""``specguard tune``: the k sweep of the playbook's phase 3. The speedup predicted at every k from one
run at the largest k (``predict``), each k of the sweep measured through the daemon's ladder API
(``daemon``, ``sweep``, ``measure``), the table (``table``), the per-batch-size schedule
(``batches``) and what ``--write`` updates (``write``)."""
