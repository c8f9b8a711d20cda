"""``python -m specguard``: the ``specguard`` command."""

from specguard.cli import main

if __name__ == "__main__":  # not when a worker process (backtest/workers.py) imports it again
    raise SystemExit(main())
