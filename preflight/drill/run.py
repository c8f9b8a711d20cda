"""The fallback drill, step by step: refuse unless nobody holds the flag; engage it through the
configured ``feature_flag`` action; see traffic move (``traffic``); try the canary as a restore
would; restore; see traffic come back; record the drill, whatever its outcome.

From the engage on, the flag is restored on every way out: a step that fails, the canary saying
no (the drill engaged the flag, so the drill takes it off: the canary's answer is what it reports),
an error, Ctrl-C or SIGTERM, a timeout that cancels the drill. The restore is carried to its end
even when cancelled again. Only a flag that the daemon took over during the drill (a rule fired,
a ladder started a change) is left engaged, to the daemon, and the drill says so. A drill killed
outright (SIGKILL) leaves its record in the action's memory; the next drill restores the flag first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from specguard.actions.base import Outcome
from specguard.actions.feature_flag import ENGAGED, RESTORED, FeatureFlagAction, record_of
from specguard.common.secrets import read_if_given
from specguard.config.loading import Loaded
from specguard.preflight.drill import claim, traffic
from specguard.rules.durations import format_duration
from specguard.store import drills
from specguard.store.database import Store, opened

UNDO_TRIES = 3  # the restore on the way out, tried this many times (each with the backend's retries)


def standard_metrics(loaded: Loaded) -> tuple[tuple[str, ...], bool]:
    """The standard servers' /metrics URLs, and whether they were given (else the routing section's
    fallback pool, read when it answers)."""
    given = loaded.config.preflight.drill.standard_metrics
    if given:
        return tuple(given), True
    routing = loaded.config.routing
    if routing is None or routing.fallback_pool not in routing.pools:
        return (), False
    return tuple(f"http://{server}/metrics" for server in routing.pools[routing.fallback_pool].servers), False


def budget(loaded: Loaded, action: FeatureFlagAction) -> float:
    """The longest a drill may take: the engage, traffic moving and coming back, the canary, the
    restore, and the restore on the way out."""
    wait = loaded.config.preflight.drill.timeout
    canary = action.canary.params.timeout if action.canary is not None else 0.0
    return 3 * action.flag.timeout + 2 * wait + canary + 30.0


@dataclass
class Result:
    drill: int
    outcome: str
    detail: str
    evidence: list[str] = field(default_factory=list)


class Refused(Exception):
    """The drill does not start; nothing was changed."""


class Failed(Exception):
    """A step of the drill failed; the flag is restored on the way out."""


class HandedOver(Exception):
    """The daemon holds the flag now; the drill leaves it to the daemon."""


@contextlib.contextmanager
def terminate_cancels() -> Iterator[None]:
    """SIGTERM cancels the drill (as Ctrl-C does under asyncio.run), so it restores the flag."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if (
        task is None
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL  # the command handles it: its own
    ):
        yield
        return
    try:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    except (NotImplementedError, RuntimeError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


class Drill:
    def __init__(self, loaded: Loaded, action: FeatureFlagAction, store: Store) -> None:
        self.loaded = loaded
        self.action = action
        self.store = store
        self.memory = claim.DrillMemory(store, action.name)
        settings = loaded.config.preflight.drill
        urls, given = standard_metrics(loaded)
        canary = action.canary.params if action.canary is not None else None
        token = (
            read_if_given(canary.token, f"actions.{action.name}.canary.token") if canary is not None else None
        )
        self.traffic = traffic.Traffic(
            loaded.config.routing,
            urls,
            settings.probe_requests,
            canary.model if canary is not None else None,
            settings.timeout,
            given,
            token,
        )
        self.evidence: list[str] = []
        self.holds = False  # the drill may have the flag engaged: restore it on the way out

    async def _holders(self) -> list[str]:
        return await claim.holders(self.store, self.action, self.loaded.rules, time.time())

    async def _timed(self, what: str, step: Callable[[], Coroutine[Any, Any, Outcome]]) -> Outcome:
        """A change of the flag, within the action's timeout, holding its lock (as the daemon's
        controller does: one change of a flag at a time in a process)."""
        try:
            async with self.action.lock, asyncio.timeout(self.action.flag.timeout):
                return await step()
        except TimeoutError:
            return Outcome(False, f"{what} timed out after {format_duration(self.action.flag.timeout)}")

    async def _recover(self) -> None:
        """A drill that did not restore the flag (killed, or its restore failed) left its record:
        restore the flag first (or leave it to the daemon when the daemon holds it now)."""
        left = await claim.left_by_drill(self.memory)
        if left is None:
            return
        which = f"drill #{left.drill}" if left.drill is not None else "an earlier drill"
        if left.running:
            raise Refused(f"{which} is under way (its record says {left.state}): one drill at a time")
        if left.drill is not None:
            number = left.drill
            await self.store.call(lambda db: _interrupted(db, number))
        held = await self._holders()
        if held:
            await claim.release(self.memory, f"taken over by the daemon: {held[0]}")
            self.evidence.append(
                f"{which} did not restore the flag; the daemon holds it now ({held[0]}): left to it"
            )
            return
        done = await self._timed("the restore", lambda: self.action.restore_flag(self.memory, canary=False))
        if not done.ok:
            raise Failed(
                f"{which} left the flag {left.state} (cut short, or its restore failed); restoring it failed: {done.detail}"
            )
        self.evidence.append(
            f"{which} left the flag {left.state} (cut short, or its restore failed): restored first ({done.detail})"
        )

    async def _precheck(self) -> None:
        held = await self._holders()
        if held:
            raise Refused("the flag is held: " + "; ".join(held))
        world = await self.action.read_world()
        if world is not None and world != RESTORED:
            why = (
                "engaged by hand?"
                if world == ENGAGED
                else "the router and its flag file disagree: set by hand?"
            )
            raise Refused(f"the flag reads {world} ({why}): not the drill's to change")
        self.evidence.append(
            "the flag reads restored; nothing holds it"
            if world is not None
            else "nothing holds the flag (its backend cannot be read back: http without read_url)"
        )
        try:
            self.evidence.extend(await self.traffic.before())
        except traffic.NoProof as exc:
            raise Refused(f"{exc}: nothing was engaged") from None

    async def steps(self, drill: int) -> None:
        await self._recover()
        await self._precheck()
        other = await claim.claim(self.memory, drill, time.time())
        if other is not None:
            raise Refused(f"drill #{other.drill} holds the flag ({other.state}): one drill at a time")
        self.holds = True
        done = await self._timed("the engage", lambda: self.action.engage(self.memory))
        if not done.ok:
            raise Failed(f"engage failed: {done.detail}")
        self.evidence.append(done.detail)
        try:
            self.evidence.extend(await self.traffic.moved())
        except traffic.NoProof as exc:
            raise Failed(str(exc)) from None
        await self._still_ours()
        if self.action.canary is not None:
            probed = await self.action.canary.probe()
            if not probed.ok:
                raise Failed(f"the canary would keep the fallback: {probed.detail}")
            self.evidence.append(f"the canary would restore: {probed.detail}")
        await self._still_ours()
        done = await self._timed("the restore", lambda: self.action.restore_flag(self.memory, canary=False))
        if not done.ok:
            raise Failed(f"restore failed: {done.detail}")
        self.holds = False
        self.evidence.append(done.detail)
        try:
            self.evidence.extend(await self.traffic.back())
        except traffic.NoProof as exc:
            raise Failed(str(exc)) from None

    async def _still_ours(self) -> None:
        held = await self._holders()
        if held:
            await claim.release(self.memory, f"taken over by the daemon: {held[0]}")
            self.holds = False
            raise HandedOver("; ".join(held))

    async def undo(self) -> str | None:
        """On the way out: restore what the drill engaged (not the canary's to decide), unless the
        daemon took the flag over. Carried to its end when cancelled again. What went wrong, or None."""
        try:
            return await self._undo()
        except Exception as exc:  # the store or the backend failing: said, never a traceback
            return f"THE FLAG MAY STILL BE ENGAGED: the restore failed: {type(exc).__name__}: {exc}"

    async def _undo(self) -> str | None:
        if not self.holds:
            return None
        record = record_of(await self.memory.read("flag"))
        if record["state"] == RESTORED:  # the engage's write never started
            return None
        held = await self._holders()
        if held:
            await claim.release(self.memory, f"taken over by the daemon: {held[0]}")
            self.evidence.append(f"the daemon holds the flag now ({held[0]}): left engaged, to it")
            return None
        last = ""
        for _ in range(UNDO_TRIES):
            done = await self._timed(
                "the restore", lambda: self.action.restore_flag(self.memory, canary=False)
            )
            if done.ok:
                self.holds = False
                self.evidence.append(f"restored on the way out: {done.detail}")
                return None
            last = done.detail
        return f"THE FLAG MAY STILL BE ENGAGED: the restore failed {UNDO_TRIES} times, last: {last}"


T = TypeVar("T")
STUBBORN = 5  # the way out started again after this many cancellations of its own, at most


async def _stubborn(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``make()`` awaited, and made again when cancelled (a second Ctrl-C, asyncio.run cancelling
    every task as it closes), up to ``STUBBORN`` times: what it does must be safe to repeat."""
    for _ in range(STUBBORN):
        try:
            return await make()
        except asyncio.CancelledError:
            continue
    return await make()


async def _carried(make: Callable[[], Coroutine[Any, Any, T]]) -> tuple[T, bool]:
    """``make()`` carried to its end in a task of its own, however often this is cancelled;
    (its result, whether a cancellation came meanwhile)."""
    task = asyncio.ensure_future(_stubborn(make))
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            cancelled = True


def _interrupted(db: sqlite3.Connection, drill: int) -> None:
    row = db.execute("SELECT outcome FROM drills WHERE id = ?", (drill,)).fetchone()
    if row is not None and row[0] == drills.RUNNING:
        drills.finish(db, drill, time.time(), drills.INTERRUPTED, "cut short: its process is gone", [])


async def run_drill(loaded: Loaded, action: FeatureFlagAction, path: Path) -> Result:
    """One drill of ``action``, recorded in the store at ``path``. Cancelled (Ctrl-C, SIGTERM, a
    timeout), it restores the flag and records the drill ``interrupted`` before the cancellation
    goes on."""
    async with opened(path) as store:
        drill = await store.call(lambda db: drills.start(db, action.name, time.time()))
        work = Drill(loaded, action, store)
        kind = next(n for n in ("nginx", "http", "file") if getattr(action.flag, n) is not None)
        work.evidence.append(f"drill #{drill} of {action.name} (its {kind} backend)")
        outcome, detail = drills.PASSED, ""
        cancelled = False
        with terminate_cancels():
            try:
                await work.steps(drill)
                detail = "engaged, traffic moved, restored" + (
                    " through the canary" if action.canary is not None else " (no canary configured)"
                )
            except Refused as exc:
                outcome, detail = drills.REFUSED, str(exc)
            except HandedOver as exc:
                outcome, detail = drills.HANDED_OVER, f"the daemon took the flag over during the drill: {exc}"
            except Failed as exc:
                outcome, detail = drills.FAILED, str(exc)
            except asyncio.CancelledError:
                outcome, detail, cancelled = drills.INTERRUPTED, "cut short (interrupted or timed out)", True
            except Exception as exc:  # a bug must not leave the flag engaged: restored, recorded
                outcome, detail = drills.FAILED, f"{type(exc).__name__}: {exc}"
            finally:
                wrong, again = await _carried(work.undo)
                cancelled = cancelled or again
                if wrong is not None:
                    outcome, detail = (
                        drills.FAILED if outcome != drills.INTERRUPTED else outcome,
                        f"{detail}; {wrong}",
                    )
                result = Result(drill, outcome, detail, work.evidence)
                await _carried(
                    lambda: store.call(
                        lambda db: drills.finish(db, drill, time.time(), outcome, detail, work.evidence)
                    )
                )
        if cancelled:
            raise asyncio.CancelledError
        return result
