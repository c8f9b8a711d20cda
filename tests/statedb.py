"""specguard's state database read beside a running daemon, and waiting on what it says: for the
tests that run the daemon as a process and check what it recorded."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


async def until(what: str, check: Callable[[], bool], seconds: float = 60.0, shown: Any = None) -> None:
    """Wait until ``check()`` holds; AssertionError naming ``what`` (and ``shown()``) past ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}" + (f": {shown()}" if shown else ""))
        await asyncio.sleep(0.02)


def query(db: Path, sql: str, *params: object) -> list[dict[str, Any]]:
    """Rows of specguard's state database, read beside the running daemon (none before it exists)."""
    if not db.exists():
        return []
    connection = sqlite3.connect(db, timeout=10)
    try:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute(sql, params)]
    finally:
        connection.close()


def runs(db: Path, action: str) -> list[dict[str, Any]]:
    """The action's runs, oldest first, each with its event's kind and time."""
    return query(
        db,
        "SELECT r.*, e.kind, e.at AS event_at FROM action_runs r JOIN events e ON e.id = r.event_id "
        "WHERE r.action = ? ORDER BY r.id",
        action,
    )


def flag_memory(db: Path, action: str = "fallback") -> dict[str, Any]:
    """The feature_flag action's record of the flag (state, since, spans...)."""
    rows = query(db, "SELECT value FROM action_memory WHERE action = ? AND key = 'flag'", action)
    return dict(json.loads(rows[0]["value"])) if rows else {}
