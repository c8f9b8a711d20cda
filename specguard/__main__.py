"""``python -m specguard``: the ``specguard`` command."""

from specguard.cli import main

raise SystemExit(main())
