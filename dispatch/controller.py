"""The fallback controller's loop: for each feature flag, on every tick, look (the drains that hold
it, the flag read back from the world), plan in one transaction (``dispatch.fallback``),
then carry out the one change that is due, within the action's timeout. A change that fails is
put back with its next try (the action's backoff); a crash anywhere leaves a state the next look
completes: a write under way is ``unknown`` until confirmed, and written again rather than assumed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from specguard.actions.base import Outcome
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.config.loading import LoadedRule
from specguard.dispatch import fallback
from specguard.rules.durations import format_duration, format_wait
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from specguard.store.records import RunMode

log = logging.getLogger("specguard.fallback")


@dataclass(frozen=True)
class Ended:
    """How one carried-out change ended, for the dispatcher to record, count and tell."""

    run: int  # 0: a change recorded on no event (a drain's)
    mode: str
    status: str  # ok | retry
    detail: str
    first_failure: bool = False


class Controller:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        ended: Callable[[FeatureFlagAction, Ended], Awaitable[None]],
    ) -> None:
        self.store = store
        self.clock = clock
        self._ended = ended
        self._read_at: dict[str, float] = {}  # when each flag was last read back from the world
        self.shown: dict[str, dict[str, object]] = {}  # each flag's last plan, for /api/status
        # Each flag whose last change failed: since when its changes fail, the last error and when,
        # the next try. Gone once a change is done.
        self.trouble: dict[str, dict[str, object]] = {}

    def status(self) -> dict[str, dict[str, object]]:
        """Each flag as /api/status shows it: what it should be and why, and its trouble if any."""
        quiet = {"failing_since": None, "last_error": None, "last_error_at": None, "next_try": None}
        return {name: {**shown, **quiet, **self.trouble.get(name, {})} for name, shown in self.shown.items()}

    async def reconcile(
        self, flag: FeatureFlagAction, rules: Mapping[str, LoadedRule]
    ) -> tuple[float | None, bool]:
        """One look at ``flag``; returns when it wants the next (a deferral's end, a retry, a
        quiet period's end), and whether it changed the world (then it looks again at once)."""
        async with flag.lock:
            now = self.clock()
            drains = []
            for drain in flag.drains:
                why = await drain.draining(StoreMemory(self.store, drain.name))
                if why is not None:
                    drains.append(f"{drain.name} ({why})")
            world = None
            if now - self._read_at.get(flag.name, float("-inf")) >= flag.read_every:
                self._read_at[flag.name] = now
                world = await flag.read_world()
            plan = await self.store.call(lambda db: fallback.plan(db, flag, rules, drains, world, now))
            for line in plan.changed:
                log.info("%s: %s", flag.name, line)
            self.shown[flag.name] = {
                "should_be": plan.desire.want,
                "why": plan.desire.why,
                "holders": list(plan.desire.holders),
                "restore_at": plan.desire.restore_at if plan.desire.want == "restored" else None,
            }
            if plan.carry_out is not None:
                await self._carry_out(flag, plan.carry_out, plan.desire)
                return None, True
            wants = [plan.next_look]
            if flag.read_every > 0:
                wants.append(
                    self._read_at[flag.name] + flag.read_every if flag.name in self._read_at else now
                )
            return min((t for t in wants if t is not None), default=None), False

    async def _carry_out(self, flag: FeatureFlagAction, run: fallback.Run, desire: fallback.Desire) -> None:
        memory = StoreMemory(self.store, flag.name)
        if run.id:
            await self.store.start_run(run.id)
        restore = run.mode == RunMode.RESTORE
        try:
            async with asyncio.timeout(flag.timeout):
                if restore:
                    outcome = await flag.restore_flag(memory, canary=desire.rule_held)
                else:
                    outcome = await flag.engage(memory)
        except TimeoutError:
            outcome = await flag.failed(memory, f"timed out after {format_duration(flag.timeout)}")
        except Exception as exc:  # an action's bug must not stop the daemon: tried again
            log.exception("%s: the %s failed", flag.name, "restore" if restore else "engage")
            outcome = await flag.failed(memory, f"{type(exc).__name__}: {exc}")
        await self._record(flag, run, outcome)

    async def _record(self, flag: FeatureFlagAction, run: fallback.Run, outcome: Outcome) -> None:
        what = "restore" if run.mode == RunMode.RESTORE else "engage"
        if outcome.ok:
            self.trouble.pop(flag.name, None)
            if run.id:
                await self.store.finish_run(run.id, "ok", outcome.detail)
            await self._ended(flag, Ended(run.id, run.mode, "ok", outcome.detail))
            return
        wait = outcome.retry_after if outcome.retry_after is not None else flag.flag.retry_backoff
        now = self.clock()
        since = self.trouble.get(flag.name, {}).get("failing_since", now)
        self.trouble[flag.name] = {
            "failing_since": since,
            "last_error": f"{what}: {outcome.detail}",
            "last_error_at": now,
            "next_try": now + wait,
        }
        if run.id:
            await self.store.retry_run(run.id, outcome.detail, self.clock() + wait)
        else:
            await flag.later(StoreMemory(self.store, flag.name), self.clock() + wait)
            log.warning("%s: %s not done, again in %s: %s", flag.name, what, format_wait(wait),
                        outcome.detail)  # fmt: skip
        await self._ended(
            flag, Ended(run.id, run.mode, "retry", outcome.detail, first_failure=run.attempts == 0)
        )
