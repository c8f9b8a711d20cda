"""The second phase: what the engine decided, stored and acted on by the daemon's own parts.

A scratch store, the real ``Rounds.settle`` (the states, events and planned runs of an evaluation
in one transaction, the guards having the last word in it, then the dispatcher), the real
dispatcher with its guards and the fallback controller, on the simulated clock; the actions are
rehearsed (``rehearsal.py``). The clock moves from one moment to the next that matters: an
evaluation of the first phase that had events, or the dispatcher's next wake (a restore after its
quiet period, a deferral that ends, a flag's next look). The silences the live store recorded over
the period are copied in first, so a firing they covered is deferred as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.actions.feature_flag import FeatureFlagAction
from specguard.backtest.judge import Judged
from specguard.backtest.rehearsal import MemoryFlag, rehearsed
from specguard.config.loading import Loaded
from specguard.daemon.round import Rounds
from specguard.daemon.shared import Shared
from specguard.dispatch import silences
from specguard.store.connection import read_only

# A step that leaves something due at once (a run in flight) is looked at again this much later,
# so that the clock always moves on.
NUDGE = 1.0
MOST_STEPS = 1_000_000


@dataclass
class Acted:
    """What the scratch store holds at the period's end."""

    events: list[dict[str, Any]] = field(default_factory=list)  # oldest first, each with its ``runs``
    flags: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # flag -> (when, engage|restore)
    silences: int = 0  # silences copied from the live store
    steps: int = 0
    # Each time a guard held a run back: (event id, action, mode) -> [{at, status, reason, until}]:
    # the run's row keeps only its last word once it has run.
    held: dict[tuple[int, str, str], list[dict[str, Any]]] = field(default_factory=dict)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def for_replay(loaded: Loaded, judged: Sequence[Judged], state_dir: Path) -> Loaded:
    """The config as the replay runs it: its state in ``state_dir``, no dry run (the question is
    what the actions would do), alone (no fleet's semaphore), the actions rehearsed, and the rules
    as replayed (a detector's interval may be a minute)."""
    config = loaded.config.model_copy(update={"state_dir": state_dir, "dry_run": False, "coordination": None})
    replayed = {j.plan.name: j.plan.item for j in judged}
    rules = [replayed.get(item.name, item) for item in loaded.rules]
    return dataclasses.replace(loaded, config=config, rules=rules, actions=rehearsed(loaded.actions))


async def act(loaded: Loaded, judged: Sequence[Judged], end: float, live_store: Path | None) -> Acted:
    """Replay ``judged``'s moments through the daemon's store and dispatcher (``loaded`` is
    ``for_replay``'s)."""
    moments: dict[float, list[tuple[int, Judged, Any]]] = {}
    for order, j in enumerate(judged):
        for moment in j.moments:
            moments.setdefault(moment.at, []).append((order, j, moment))
    times = sorted(moments)
    clock = Clock(times[0] if times else end)
    shared = Shared(loaded, clock)
    await shared.source.close()  # the config's sources: never read here
    if shared.history_source is not None:
        await shared.history_source.close()
    rounds = Rounds(shared)
    acted = Acted()
    flags = {
        name: a.backend
        for name, a in loaded.actions.items()
        if isinstance(a, FeatureFlagAction) and isinstance(a.backend, MemoryFlag)
    }
    seen = {name: 0 for name in flags}
    # The phase's threads (the store's, the loop's pool's) are joined when it ends: a backtest after
    # this one (``--compare``) then forks its workers from a single-threaded process (workers.py).
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(thread_name_prefix="specguard-backtest")
    loop.set_default_executor(pool)
    await shared.store.open()
    try:
        if live_store is not None and times:
            acted.silences = await _copy_silences(shared, live_store, times[0], end)
        index = 0
        while times and clock.now <= end and acted.steps < MOST_STEPS:
            now = clock.now
            while index < len(times) and times[index] <= now:
                for _, j, moment in sorted(moments[times[index]], key=lambda m: m[0]):
                    await rounds.settle(
                        j.plan.item, moment.previous, moment.outcome, moment.result, moment.at
                    )
                index += 1
            await shared.dispatcher.step()
            acted.steps += 1
            await _note_held(shared, acted, now)
            for name, backend in flags.items():
                assert isinstance(backend, MemoryFlag)
                for what in backend.changes[seen[name] :]:
                    acted.flags.setdefault(name, []).append((now, what))
                seen[name] = len(backend.changes)
            wake = await shared.dispatcher.next_wake()
            later = [t for t in (times[index] if index < len(times) else None, wake) if t is not None]
            if not later:
                break
            clock.now = max(min(later), now + NUDGE)
        acted.events = list(reversed(await shared.store.history(limit=100_000_000)))
    finally:
        await shared.dispatcher.stop()
        await shared.store.close()
        loop.set_default_executor(ThreadPoolExecutor())  # no thread until something uses it
        pool.shutdown(wait=True)
    return acted


_HELD = "SELECT event_id, action, mode, status, reason, not_before FROM action_runs WHERE status IN ('deferred', 'skipped')"


async def _note_held(shared: Shared, acted: Acted, now: float) -> None:
    """The runs the guards hold back now (deferred or skipped), each new reason kept with when."""
    for row in await shared.store.call(lambda db: db.execute(_HELD).fetchall()):
        said = acted.held.setdefault((int(row[0]), str(row[1]), str(row[2])), [])
        if said and (said[-1]["status"], said[-1]["reason"], said[-1]["until"]) == (row[3], row[4], row[5]):
            continue
        said.append({"at": now, "status": row[3], "reason": row[4], "until": row[5]})


async def _copy_silences(shared: Shared, live_store: Path, start: float, end: float) -> int:
    """The live store's silences that overlap the period, each as it was in force (an expired one
    up to its expiry)."""
    try:
        with contextlib.closing(read_only(live_store)) as db:
            rows = db.execute(
                "SELECT rule, match, starts, ends, reason, author, expired FROM silences WHERE ends > ? AND starts < ?",
                (start, end),
            ).fetchall()
    except sqlite3.Error:
        return 0
    copied = 0
    for row in rows:
        ends = row["ends"] if row["expired"] is None else min(row["ends"], row["expired"])
        if not ends > row["starts"]:
            continue

        def add(db: sqlite3.Connection, row: Any = row, ends: float = ends) -> None:
            silences.add(
                db, rule=row["rule"], match=json.loads(row["match"]), starts=row["starts"], ends=ends,
                reason=row["reason"], author=row["author"], now=row["starts"], longest=math.inf,
            )  # fmt: skip

        await shared.store.call(add)
        copied += 1
    return copied
