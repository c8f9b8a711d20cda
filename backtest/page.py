"""The backtest's page (placeholder while it is written)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specguard.backtest.run import Backtest


def write_page(path: Path, runs: Sequence[tuple[str, Backtest]]) -> None:
    raise NotImplementedError
