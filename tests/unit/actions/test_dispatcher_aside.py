"""An action's own work (a notifier's outbox, ``tick``) is carried out beside the dispatcher's loop,
one at a time per action: a dependency that hangs holds back that action alone, never another
action's due run (a restore after its quiet period) nor the loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome
from daemon.dispatch import Dispatcher
from daemon.engine import Event, SeriesState, State
from daemon.loading import LoadedRule
from daemon.selfmetrics import DaemonMetrics
from daemon.store import Store
from rules.schema import Rule

HANG_GUARD = 20.0  # seconds; the stuck outbox holds on for 120


class Switch(Action):
    type = "switch"
    changes_world = True
    calls: ClassVar[list[str]] = []

    @property
    def restore_delay(self) -> float:
        return 0.3

    async def run(self, ctx: ActionContext) -> Outcome:
        Switch.calls.append("engage")
        return Outcome(True, "engaged")

    async def restore(self, ctx: ActionContext) -> Outcome:
        Switch.calls.append("restore")
        return Outcome(True, "restored")


class Stuck(Action):
    """An outbox whose deliveries hang (a Slack that never answers), up to its timeout."""

    type = "stuck"
    ticks: ClassVar[int] = 0
    at_once: ClassVar[int] = 0
    most_at_once: ClassVar[int] = 0

    async def run(self, ctx: ActionContext) -> Outcome:
        return Outcome(True, "queued")

    async def tick(self, memory: ActionMemory) -> float | None:
        Stuck.ticks += 1
        Stuck.at_once += 1
        Stuck.most_at_once = max(Stuck.most_at_once, Stuck.at_once)
        try:
            await asyncio.sleep(3600)
        finally:
            Stuck.at_once -= 1
        return None


def rule() -> LoadedRule:
    raw: dict[str, Any] = {
        "name": "low",
        "signal": "acceptance_rate",
        "condition": "< 0.5",
        "actions": ["switch", "stuck"],
    }
    return LoadedRule(Rule.model_validate(raw), "rules.yaml", 2)


def event(kind: State, at: float) -> Event:
    previous = State.PENDING if kind is State.FIRING else State.FIRING
    return Event("low", "{}", {}, kind, previous, at, 0.3, 0.5)


async def commit(store: Store, d: Dispatcher, item: LoadedRule, ev: Event) -> None:
    state = SeriesState(labels=ev.labels, state=ev.kind, since=ev.at)
    pending = await store.commit_evaluation(item.name, {ev.series: state}, [d.record(item, ev)])
    await d.run(pending)


async def test_a_hung_outbox_holds_back_no_other_actions_restore(store: Store) -> None:
    Switch.calls = []
    Stuck.ticks = Stuck.at_once = Stuck.most_at_once = 0
    actions: dict[str, Action] = {
        "switch": Switch("switch", ActionParams(type="switch")),
        "stuck": Stuck("stuck", ActionParams(type="stuck", timeout=120.0)),
    }
    d = Dispatcher(store, actions, False, DaemonMetrics())
    serving = asyncio.create_task(d.serve())
    try:
        item = rule()
        await commit(store, d, item, event(State.FIRING, time.time()))
        deadline = time.monotonic() + HANG_GUARD
        while Stuck.ticks == 0:  # the outbox is being delivered, and hangs
            assert time.monotonic() < deadline, "the outbox was never delivered"
            await asyncio.sleep(0.01)
        await commit(store, d, item, event(State.RESOLVED, time.time()))
        while "restore" not in Switch.calls:
            assert time.monotonic() < deadline, (
                f"the restore waited for the hung outbox: {Switch.calls}, "
                f"{[(r['mode'], r['status']) for r in await store.action_runs()]}"
            )
            await asyncio.sleep(0.01)
        assert Switch.calls == ["engage", "restore"]
        assert Stuck.most_at_once == 1  # one delivery pass at a time, however often it was asked
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await d.stop()
