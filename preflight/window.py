"""History over a period, read once per run from the state database (``store/history.py``): each
configured vLLM server's spans, for the items that judge production traffic (acceptance, speedup,
KV cache).

Without a state database (the daemon has not run here, or keeps it elsewhere) an item cannot tell:
``Unread`` says why, and the item answers unknown. History the daemon has not kept (``history.enabled:
false``) is said the same way.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from specguard.preflight.item import Context
from specguard.preflight.servers import targets
from specguard.store import history
from specguard.store.connection import read_only
from specguard.store.history import Span

DAY = 86400.0
T = TypeVar("T")


class Unreadable(Exception):
    """The state database cannot be read; the message names it and why."""


async def query(path: Path, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn`` on a read-only connection to the state database at ``path``: preflight writes nothing
    there (the daemon may be running, and the database may belong to its user). Raises Unreadable."""

    def run() -> T:
        try:
            db = read_only(path)
        except sqlite3.Error as exc:
            raise Unreadable(f"cannot read the state database {path}: {exc}") from None
        try:
            return fn(db)
        except sqlite3.Error as exc:
            raise Unreadable(f"cannot read the state database {path}: {exc}") from None
        finally:
            db.close()

    return await asyncio.to_thread(run)


@dataclass(frozen=True)
class Unread:
    why: str


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    spans: dict[tuple[str, str], list[Span]]  # (instance, model) -> spans, oldest first; no router


def period(seconds: float) -> str:
    """``7d``, ``36h``, ``90m``: a period as the config writes it."""
    for unit, size in (("d", DAY), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


async def read(ctx: Context, seconds: float) -> Window | Unread:
    """History of the last ``seconds`` (cached by the period)."""
    key = f"history:{seconds}"
    cached = ctx.cache.get(key)
    if cached is None:
        cached = await _read(ctx, seconds)
        ctx.cache[key] = cached
    assert isinstance(cached, Window | Unread)
    return cached


async def _read(ctx: Context, seconds: float) -> Window | Unread:
    if not ctx.loaded.config.history.enabled:
        return Unread("history.enabled is false in the config: the daemon keeps no history to read")
    if ctx.store_file is None or not ctx.store_file.is_file():
        where = f" at {ctx.store_file}" if ctx.store_file is not None else ""
        return Unread(f"no state database{where}: the daemon has not run with this config's state_dir")
    start, end = ctx.now - seconds, ctx.now

    def fetch(db: sqlite3.Connection) -> dict[tuple[str, str], list[Span]]:
        return history.read(db, start, end)

    try:
        found = await query(ctx.store_file, fetch)
    except Unreadable as exc:
        return Unread(str(exc))
    # The servers this config names (history may hold others, since removed); never the router's
    # page, which has no model_name.
    named = {instance for _, instance in targets(ctx)}
    kept = {key: spans for key, spans in found.items() if key[1] != "" and (not named or key[0] in named)}
    return Window(start, end, kept)


async def minutes(ctx: Context, start: float, end: float) -> dict[tuple[str, str], list[Span]]:
    """Minute rows of ``[start, end)`` (an hour whose minutes an item needs one by one)."""
    assert ctx.store_file is not None

    def fetch(db: sqlite3.Connection) -> dict[tuple[str, str], list[Span]]:
        return history.read(db, start, end, hours=False)

    return await query(ctx.store_file, fetch)
