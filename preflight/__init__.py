"""``specguard preflight``: the playbook's pre-deploy checklist, each item checked on this host and
answered pass, fail or unknown with its evidence and the command that fixes it.

It sits above the playbook's tools, the exports and the report (it checks all of them), beside the
demo, below the command line."""
