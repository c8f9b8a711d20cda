"""The ``specguard`` command: ``entry`` builds the parser from each command's module (``run``,
``check``, ``eval``, ``history``, ``silence``, ``demo``, ``simulate``, ``signals``, ``export``,
``status``, ``ladder``, ``report``, ``backup``) and ``main`` runs the command asked for; what several
share is in ``shared`` (``options``, ``printing``, ``statedb``, ``rulenames``, ``detectors``)."""

from specguard.cli.entry import main

__all__ = ["main"]
