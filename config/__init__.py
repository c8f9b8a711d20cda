"""The daemon's configuration: its schema (``schema``), and loading it with the rules and their
actions, every problem named by file, line and field (``loading``, ``crosscheck``)."""
