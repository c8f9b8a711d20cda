"""An action's own work (a notifier's outbox, ``tick``) is carried out beside the dispatcher's loop,
one at a time per action: a dependency that hangs holds back that action alone, never another
action's due run (a restore after its quiet period) nor the loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome
from specguard.config.loading import LoadedRule
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.schema import Rule
from specguard.store.database import Store
from specguard.store.records import Event, SeriesState, State

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


class Hanging(Action):
    """A world-changing action whose run hangs (its dependency never answers)."""

    type = "hanging"
    changes_world = True
    calls: ClassVar[list[str]] = []

    async def run(self, ctx: ActionContext) -> Outcome:
        Hanging.calls.append("run")
        await asyncio.sleep(3600)
        return Outcome(True, "done")

    async def restore(self, ctx: ActionContext) -> Outcome:
        Hanging.calls.append("restore")
        return Outcome(True, "restored")


async def test_a_run_due_behind_a_hung_run_of_its_action_waits_without_spinning(store: Store) -> None:
    """The restore is due at once, but its action is busy with a run that hangs: the loop looks
    again now and then, not in a tight loop, and the restore comes after the run."""
    Hanging.calls = []
    d = Dispatcher(store, {"hanging": Hanging("hanging", ActionParams(type="hanging", timeout=120.0))}, False,
                   DaemonMetrics())  # fmt: skip
    asked = 0
    real = store.next_due

    async def next_due() -> float | None:
        nonlocal asked
        asked += 1
        return await real()

    store.next_due = next_due  # type: ignore[method-assign]
    item = LoadedRule(
        Rule.model_validate(
            {"name": "low", "signal": "acceptance_rate", "condition": "< 0.5", "actions": ["hanging"]}
        ),
        "rules.yaml",
        2,
    )
    serving = asyncio.create_task(d.serve())
    try:
        state = SeriesState(labels={}, state=State.FIRING, since=time.time())
        pending = await store.commit_evaluation(
            "low", {"{}": state}, [d.record(item, event(State.FIRING, time.time()))]
        )
        await d.run(pending, wait=False)
        deadline = time.monotonic() + HANG_GUARD
        while Hanging.calls != ["run"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        state = SeriesState(labels={}, state=State.RESOLVED, since=time.time())
        pending = await store.commit_evaluation(
            "low", {"{}": state}, [d.record(item, event(State.RESOLVED, time.time()))]
        )
        await d.run(pending, wait=False)
        asked = 0
        await asyncio.sleep(2.0)
        assert asked < 20, f"the loop asked for the next due run {asked} times in 2 s"
        assert Hanging.calls == ["run"]  # the restore waits for the run under way
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await d.stop()


class Slow(Action):
    """A notifier whose run takes a while (a Slack that answers slowly), then says it is done."""

    type = "slow"
    done: ClassVar[list[str]] = []

    async def run(self, ctx: ActionContext) -> Outcome:
        await asyncio.sleep(0.3)
        Slow.done.append(ctx.event)
        return Outcome(True, "told")


async def test_a_run_that_waits_waits_for_the_runs_a_round_started_too(store: Store) -> None:
    """A round starts its runs and goes on; whoever then asks the dispatcher to run and wait (a
    replayed week, a test's tick, the start-up) gets them over too, not only those it started."""
    Slow.done = []
    d = Dispatcher(store, {"slow": Slow("slow", ActionParams(type="slow"))}, False, DaemonMetrics())
    item = LoadedRule(
        Rule.model_validate(
            {"name": "low", "signal": "acceptance_rate", "condition": "< 0.5", "actions": ["slow"]}
        ),
        "rules.yaml",
        2,
    )
    try:
        state = SeriesState(labels={}, state=State.FIRING, since=time.time())
        pending = await store.commit_evaluation(
            "low", {"{}": state}, [d.record(item, event(State.FIRING, time.time()))]
        )
        await d.run(pending, wait=False)  # as an evaluation round does
        assert Slow.done == []
        await d.run()  # nothing new to start: the round's run is under way
        assert Slow.done == ["firing"], await store.action_runs()
        (run,) = [r for r in await store.action_runs() if r["action"] == "slow"]
        assert run["status"] == "ok", run
    finally:
        await d.stop()
