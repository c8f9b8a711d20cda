"""Who holds the flag, and the drill's own claim on it.

The drill changes the flag through the configured ``feature_flag`` action (its backend, its
journal of a write under way), but keeps what it engaged in its own record: the action's memory
under the key ``drill``, beside the ``flag`` record the daemon's fallback controller keeps. The
controller's record stays ``restored``, so the controller, when it reads the flag engaged, takes it
for a flag "engaged, and not by specguard" and leaves it alone (``dispatch.fallback._seen`` and
``decide``: not its own to undo while nothing fires). It never restores a drill's flag, and the
drill never restores a flag the controller holds: before each change the drill reads the
controller's record, the rules that name the flag, and the ladders that drain through it.

A drill's record names its process; a record left ``engaged`` or ``unknown`` by a process that is
gone (killed before it could restore) is the next drill's to restore first.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specguard.actions.feature_flag import RESTORED, STATE_KEY, UNKNOWN, FeatureFlagAction, record_of
from specguard.config.loading import LoadedRule
from specguard.dispatch import fallback
from specguard.rules.durations import format_duration
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

DRILL_KEY = "drill"


class DrillMemory:
    """The action's memory with its ``flag`` record read and written under ``drill``: what the
    action's ``engage`` and ``restore_flag`` journal and confirm lands in the drill's record, not
    in the controller's. Every other key (a ladder's) is the action's own."""

    def __init__(self, store: Store, action: str) -> None:
        self.memory = StoreMemory(store, action)

    @staticmethod
    def _key(key: str) -> str:
        return DRILL_KEY if key == STATE_KEY else key

    async def read(self, key: str) -> Any:
        return await self.memory.read(self._key(key))

    async def update(
        self,
        key: str,
        change: Callable[[Any], Any],
        notes: Callable[[], Sequence[tuple[int, str]]] | None = None,
    ) -> Any:
        return await self.memory.update(self._key(key), change, notes)

    def of(self, action: str) -> StoreMemory:
        return self.memory.of(action)


def me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def alive(record: dict[str, Any]) -> bool:
    """The drill that wrote ``record`` still runs (on this host; one on another host is taken to)."""
    if record.get("host") != socket.gethostname():
        return True
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return True  # this process: a drill of its own still under way
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Left:
    """A drill's record that says it may hold the flag."""

    drill: int | None
    started: float | None
    state: str
    running: bool  # its process still runs


async def left_by_drill(memory: DrillMemory) -> Left | None:
    record = await memory.read(STATE_KEY)
    if not record:
        return None
    full = record_of(record)
    if full["state"] == RESTORED:
        return None
    return Left(record.get("drill"), record.get("started"), full["state"], alive(record))


async def claim(memory: DrillMemory, drill: int, now: float) -> Left | None:
    """Take the drill's record for drill ``drill``, in one transaction; the record of another
    drill that holds it instead (then nothing is taken)."""
    held: list[Left] = []

    def take(value: Any) -> Any:
        if value:
            full = record_of(value)
            if full["state"] != RESTORED:
                held.append(Left(value.get("drill"), value.get("started"), full["state"], alive(value)))
                return value
        fresh = {**record_of(value), **me(), "drill": drill, "started": now}
        fresh.pop("released", None)
        # taken: not restored from here on, so that a second drill claiming at the same moment
        # finds it held (the engage that follows journals and confirms it)
        fresh.update(state=UNKNOWN, engaged=False)
        return fresh

    await memory.update(STATE_KEY, take)
    return held[0] if held else None


async def release(memory: DrillMemory, why: str) -> None:
    """The drill no longer holds the flag (the daemon does now, or nothing changed): its record
    says so without touching the flag."""
    await memory.update(STATE_KEY, lambda v: {**record_of(v), "state": RESTORED, "engaged": False,
                                              "released": why})  # fmt: skip


async def holders(
    store: Store, action: FeatureFlagAction, rules: Sequence[LoadedRule], now: float
) -> list[str]:
    """Why the flag is not the drill's to change now: the controller's record (engaged, or a write
    whose outcome is not known), a series of a rule naming the flag that fires (silenced or not),
    a ladder draining through it. Empty: nobody holds it."""
    said: list[str] = []
    record = record_of(await store.memory_read(action.name, STATE_KEY))
    if record["state"] != RESTORED:
        since = record.get("since")
        lasting = f" for {format_duration(round(max(0.0, now - float(since))))}" if since else ""
        said.append(
            f"specguard's fallback controller has the flag {record['state']}{lasting}"
            + (
                f" (held by {', '.join(sorted(record.get('holders') or {})[:3])})"
                if record.get("holders")
                else ""
            )
        )
    by_name = {item.name: item for item in rules}
    eligible = fallback.eligible_rules(by_name, action.name)
    firing = await store.call(lambda db: fallback.read_firing(db, eligible, now))
    if firing:
        shown = ", ".join(f.holder + (" (silenced)" if f.silence is not None else "") for f in firing[:3])
        more = f" and {len(firing) - 3} more" if len(firing) > 3 else ""
        said.append(f"a rule that names {action.name} fires: {shown}{more}")
    for drain in action.drains:
        why = await drain.draining(StoreMemory(store, drain.name))
        if why is not None:
            said.append(f"the ladder {drain.name} holds the flag: {why}")
    return said
