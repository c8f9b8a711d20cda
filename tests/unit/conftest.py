"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specguard.store.database import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A real store (SQLite, WAL) in the test's own directory."""
    opened = Store(tmp_path / "state" / "specguard.db")
    await opened.open()
    yield opened
    await opened.close()
