"""The ``specguard`` command: ``main`` builds the parser and runs a command (``commands.py``, with
the smaller commands); the larger commands have a module each (``status``, ``report``, ``ladder``,
``backup``)."""

from specguard.cli.commands import main

__all__ = ["main"]
