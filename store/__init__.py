"""The store: the SQLite database of rule states, events, action runs and the outbox (``database``
for the way in, ``schema``, ``connection``, ``commits`` and ``queries`` beneath it), the records
they are made of (``records``), the per-minute history of the signals (``history``) and the
measured baseline (``baseline``).

Below the daemon, the dispatcher, the engine and the report, which all read or write it.
"""
