"""The guards between the dispatcher and the actions (dedup, cooldown, budget, resolutions of
what was not acted on), and the restore path of world-changing actions, with the real store."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from specguard.actions.base import Action, ActionContext, ActionParams, Outcome
from specguard.config.loading import LoadedRule
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.schema import Rule
from specguard.store.database import Store
from specguard.store.records import Event, SeriesState, State

SERIES = '{"instance":"h:8000"}'


class Tell(Action):
    """Only tells (a notice): runs on firing and on resolved."""

    type = "tell"
    calls: ClassVar[list[tuple[str, str, float]]] = []

    async def run(self, ctx: ActionContext) -> Outcome:
        Tell.calls.append((ctx.event, ctx.series, time.time()))
        return Outcome(True, "told")


class Switch(Action):
    """Changes the world: engaged on firing, restored after ``restore_delay``."""

    type = "switch"
    calls: ClassVar[list[tuple[str, str, float]]] = []
    refuse: ClassVar[int] = 0  # restores to refuse (a canary that sees acceptance still low)
    changes_world = True
    delay: ClassVar[float] = 0.3

    @property
    def restore_delay(self) -> float:
        return self.delay

    async def run(self, ctx: ActionContext) -> Outcome:
        Switch.calls.append(("engage", ctx.series, time.time()))
        return Outcome(True, "engaged")

    async def restore(self, ctx: ActionContext) -> Outcome:
        Switch.calls.append(("restore", ctx.series, time.time()))
        if Switch.refuse:
            Switch.refuse -= 1
            return Outcome(False, "canary: acceptance 0.31, below 0.6", retry_after=0.2)
        return Outcome(True, "restored")


@pytest.fixture(autouse=True)
def _reset() -> None:
    Tell.calls = []
    Switch.calls = []
    Switch.refuse = 0
    Switch.delay = 0.3


def dispatcher(store: Store, **params: Any) -> Dispatcher:
    actions: dict[str, Action] = {
        "tell": Tell("tell", ActionParams.model_validate({"type": "tell", **params})),
        "switch": Switch("switch", ActionParams.model_validate({"type": "switch", **params})),
    }
    return Dispatcher(store, actions, False, DaemonMetrics(), rules=[rule(("tell", "switch"))])


def rule(actions: tuple[str, ...] = ("tell",)) -> LoadedRule:
    raw = {"name": "low", "signal": "acceptance_rate", "condition": "< 0.5", "actions": list(actions)}
    return LoadedRule(Rule.model_validate(raw), "rules.yaml", 2)


def event(kind: State, at: float, series: str = SERIES) -> Event:
    labels = json.loads(series)
    previous = State.PENDING if kind is State.FIRING else State.FIRING
    return Event("low", series, labels, kind, previous, at, 0.3, 0.5)


async def commit(store: Store, d: Dispatcher, item: LoadedRule, *events: Event) -> list[int]:
    states = {e.series: SeriesState(labels=e.labels, state=e.kind, since=e.at) for e in events}
    records = [d.record(item, e) for e in events]
    pending = await store.commit_evaluation(item.name, states, records, d.guard)
    await d.run(pending)
    return pending


async def runs(store: Store) -> list[tuple[str, str, str]]:
    rows = sorted(await store.action_runs(), key=lambda r: r["id"])
    return [(r["action"], r["status"], r["reason"]) for r in rows]


async def test_a_world_change_still_standing_is_not_made_again_and_a_new_incident_is_paged(
    store: Store,
) -> None:
    d = dispatcher(store)
    now = time.time()
    both = rule(("switch", "tell"))
    await commit(store, d, both, event(State.FIRING, now))
    # the series fires again without a resolution: it was forgotten (no data, or its rule removed
    # and added back) and is a new incident; what the switch changed still stands
    await commit(store, d, both, event(State.FIRING, now + 1))
    assert [kind for kind, _, _ in Switch.calls] == ["engage"]
    assert [kind for kind, _, _ in Tell.calls] == ["firing", "firing"]
    rows = await runs(store)
    assert rows[:2] == [("switch", "ok", ""), ("tell", "ok", "")]
    assert rows[2][1] == "skipped" and rows[2][2].startswith(
        "dedup: this series' firing was acted on already (run 1)"
    )
    assert rows[3] == ("tell", "ok", "")
    # once resolved, a new firing is acted on
    await commit(store, d, both, event(State.RESOLVED, now + 2))
    await commit(store, d, both, event(State.FIRING, now + 3))
    assert [kind for kind, _, _ in Tell.calls] == ["firing", "firing", "resolved", "firing"]


async def test_cooldown_defers_a_flapping_series_and_a_resolution_ends_the_deferral(store: Store) -> None:
    d = dispatcher(store, cooldown="10m")
    now = time.time()
    await commit(store, d, rule(), event(State.FIRING, now))
    await commit(store, d, rule(), event(State.RESOLVED, now + 60))
    await commit(store, d, rule(), event(State.FIRING, now + 120))  # deferred: the cooldown holds it
    (*_, deferred) = sorted(await store.action_runs(), key=lambda r: r["id"])
    assert (deferred["status"], deferred["not_before"]) == ("deferred", pytest.approx(now + 600))
    assert deferred["reason"] == "cooldown: acted on this series' firing 2m ago; the cooldown is 10m"
    await commit(store, d, rule(), event(State.RESOLVED, now + 180))  # over before the cooldown ended
    await commit(store, d, rule(), event(State.FIRING, now + 601))  # the cooldown is over
    assert [kind for kind, _, _ in Tell.calls] == ["firing", "resolved", "firing"]
    reasons = [reason for _, status, reason in await runs(store) if status == "skipped"]
    assert reasons == [
        "the series resolved while held back (cooldown: acted on this series' firing 2m ago; the cooldown "
        "is 10m): nothing to do",
        "the firing was not acted on: nothing to tell",
    ]


async def test_a_firing_deferred_by_the_cooldown_runs_when_it_ends_if_the_series_still_fires(
    tmp_path: Path,
) -> None:
    clock = Clock(time.time())
    store = Store(tmp_path / "specguard.db", clock=clock)
    await store.open()
    try:
        d = dispatcher(store, cooldown="10m")
        start = clock.now
        await commit(store, d, rule(), event(State.FIRING, start))
        await commit(store, d, rule(), event(State.RESOLVED, start + 60))
        clock.now = start + 120
        await commit(store, d, rule(), event(State.FIRING, start + 120))
        assert [kind for kind, _, _ in Tell.calls] == ["firing", "resolved"]
        assert await store.next_due() == pytest.approx(start + 600)
        clock.now = start + 599
        await d.step()
        assert len(Tell.calls) == 2  # not yet
        clock.now = start + 600
        await d.step()
        assert [kind for kind, _, _ in Tell.calls] == ["firing", "resolved", "firing"]
        (*_, last) = sorted(await store.action_runs(), key=lambda r: r["id"])
        assert (last["status"], last["admitted"]) == ("ok", start + 600)
    finally:
        await store.close()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_budget_counts_every_rule_and_series_defers_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "specguard.db"
    clock = Clock(time.time())
    now = clock.now
    store = Store(path, clock=clock)
    await store.open()
    d = dispatcher(store, budget={"runs": 2, "per": "1h"})
    series = [f'{{"instance":"h{i}"}}' for i in range(3)]
    # three series fire in one evaluation: the third is over the budget, in the same transaction
    await commit(store, d, rule(), *(event(State.FIRING, now, s) for s in series))
    assert len(Tell.calls) == 2
    deferred = [r for r in await store.action_runs() if r["status"] == "deferred"]
    assert [r["reason"] for r in deferred] == [
        "budget: tell ran 2 times in the last 1h; its budget is 2 per 1h"
    ]
    assert deferred[0]["not_before"] == pytest.approx(now + 3600)
    await store.close()

    store = Store(path, clock=clock)  # a restart: the budget is read from the store, not from memory
    await store.open()
    try:
        d = dispatcher(store, budget={"runs": 2, "per": "1h"})
        clock.now = now + 10
        await d.step()
        assert len(Tell.calls) == 2  # still over the budget
        clock.now = now + 3600  # the window has room: the third series, still firing, is told now
        await d.step()
        assert len(Tell.calls) == 3 and Tell.calls[-1][1] == series[2]
        skipped = [reason for _, status, reason in await runs(store) if status == "skipped"]
        assert skipped == []
    finally:
        await store.close()


async def test_a_world_changing_action_is_restored_after_its_quiet_period(store: Store) -> None:
    d = dispatcher(store)
    serving = asyncio.create_task(d.serve())
    try:
        now = time.time()
        await commit(store, d, rule(("switch", "tell")), event(State.FIRING, now))
        resolved_at = time.time()
        await commit(store, d, rule(("switch", "tell")), event(State.RESOLVED, resolved_at))
        # the notice goes at once; the restore waits for the quiet period
        assert [kind for kind, _, _ in Tell.calls] == ["firing", "resolved"]
        assert [kind for kind, _, _ in Switch.calls] == ["engage"]
        for _ in range(400):
            if len(Switch.calls) == 2:
                break
            await asyncio.sleep(0.01)
        assert [kind for kind, _, _ in Switch.calls] == ["engage", "restore"]
        assert Switch.calls[1][2] >= resolved_at + Switch.delay  # recorded time, not a sleep's luck
        rows = sorted(await store.action_runs(), key=lambda r: r["id"])
        restore = next(r for r in rows if r["mode"] == "restore")
        assert (restore["status"], restore["detail"]) == ("ok", "restored")
        assert restore["not_before"] == pytest.approx(resolved_at + Switch.delay)
    finally:
        serving.cancel()


async def test_firing_again_in_the_quiet_period_calls_the_restore_off(store: Store) -> None:
    Switch.delay = 3600.0
    d = dispatcher(store)
    now = time.time()
    await commit(store, d, rule(("switch",)), event(State.FIRING, now))
    await commit(store, d, rule(("switch",)), event(State.RESOLVED, now + 60))
    await commit(store, d, rule(("switch",)), event(State.FIRING, now + 120))
    assert [kind for kind, _, _ in Switch.calls] == ["engage"]  # still engaged: nothing to do
    assert await runs(store) == [
        ("switch", "ok", ""),
        ("switch", "skipped", "fired again during the quiet period: the series still holds it"),
        ("switch", "skipped", "dedup: this series' firing was acted on already (run 1) and has not resolved"),
    ]
    assert await store.next_due() is None


async def test_a_refused_restore_is_tried_again_later_and_survives_a_restart(tmp_path: Path) -> None:
    Switch.delay = 0.0
    Switch.refuse = 1
    path = tmp_path / "specguard.db"
    store = Store(path)
    await store.open()
    d = dispatcher(store)
    now = time.time()
    await commit(store, d, rule(("switch",)), event(State.FIRING, now - 10))
    await commit(store, d, rule(("switch",)), event(State.RESOLVED, now - 5))  # no quiet period: due
    refused_at = Switch.calls[-1][2]
    rows = sorted(await store.action_runs(), key=lambda r: r["id"])
    assert (rows[1]["status"], rows[1]["detail"]) == ("pending", "canary: acceptance 0.31, below 0.6")
    assert rows[1]["not_before"] >= refused_at + 0.2
    await store.close()

    store = Store(path)  # the daemon restarts while the restore waits
    await store.open()
    try:
        d = dispatcher(store)
        serving = asyncio.create_task(d.serve())
        for _ in range(400):  # until the restore's outcome is stored (the call comes before it)
            rows = sorted(await store.action_runs(), key=lambda r: r["id"])
            if rows[1]["status"] != "pending" and rows[1]["status"] != "running":
                break
            await asyncio.sleep(0.01)
        serving.cancel()
        assert [kind for kind, _, _ in Switch.calls] == ["engage", "restore", "restore"]
        assert Switch.calls[2][2] >= refused_at + 0.2
        rows = sorted(await store.action_runs(), key=lambda r: r["id"])
        assert (rows[1]["status"], rows[1]["attempts"]) == ("ok", 2)
    finally:
        await store.close()


async def test_notes_an_action_keeps_with_its_memory_are_shown_under_their_event(store: Store) -> None:
    d = dispatcher(store)
    await commit(store, d, rule(), event(State.FIRING, time.time()))
    (fired,) = await store.history()
    assert fired["notes"] == []

    value = await store.memory_update(
        "tell",
        "outbox",
        lambda v: {"sent": 1},
        lambda: [(fired["id"], "notice 1 posted"), (fired["id"] + 99, "x")],
    )
    assert value == {"sent": 1}  # a note for an event the store does not have is dropped, not the update
    assert await store.memory_read("tell", "outbox") == {"sent": 1}
    (shown,) = await store.history()
    assert [(n["action"], n["text"]) for n in shown["notes"]] == [("tell", "notice 1 posted")]
    assert shown["notes"][0]["at"] >= fired["at"]


class OneWay(Switch):
    """Changes the world and undoes nothing on a resolution (a ladder stepped up by hand)."""

    type = "oneway"

    @property
    def restores(self) -> bool:
        return False


async def test_a_world_changing_action_that_does_not_restore_is_not_run_on_a_resolution(store: Store) -> None:
    actions: dict[str, Action] = {"oneway": OneWay("oneway", ActionParams.model_validate({"type": "oneway"}))}
    d = Dispatcher(store, actions, False, DaemonMetrics())
    now = time.time()
    await commit(store, d, rule(("oneway",)), event(State.FIRING, now - 1))
    await commit(store, d, rule(("oneway",)), event(State.RESOLVED, now))
    assert [kind for kind, _, _ in Switch.calls] == ["engage"]  # no second run, no restore
    assert await runs(store) == [("oneway", "ok", "")]


async def test_vllm_restart_by_default_restarts_at_most_twice_an_hour_and_once_per_series_in_10m(
    store: Store, tmp_path: Path
) -> None:
    from specguard.actions.vllm_restart import VllmRestartAction, VllmRestartParams

    params = VllmRestartParams.model_validate(
        {
            "type": "vllm_restart",
            "ladder": [5, 3, 1, 0],
            "env_file": {"path": str(tmp_path / "s.env")},
            "unit": "vllm.service",
        }
    )
    d = Dispatcher(store, {"shrink": VllmRestartAction("shrink", params)}, False, DaemonMetrics())
    item = rule(("shrink",))
    now = time.time()

    async def fire(series: str, at: float, kind: State = State.FIRING) -> tuple[str, str]:
        e = event(kind, at, series)
        states = {e.series: SeriesState(labels=e.labels, state=e.kind, since=e.at)}
        await store.commit_evaluation(item.name, states, [d.record(item, e)], d.guard)  # recorded, not run
        rows = sorted(await store.action_runs(), key=lambda r: r["id"])
        return (rows[-1]["status"], rows[-1]["reason"].split(":")[0]) if rows else ("none", "")

    assert await fire('{"instance":"a:8000"}', now - 120) == ("pending", "")
    assert await fire('{"instance":"a:8000"}', now - 100, State.RESOLVED) == ("pending", "")  # no run for it
    assert await fire('{"instance":"a:8000"}', now - 90) == ("deferred", "cooldown")  # same series, 30 s on
    assert await fire('{"instance":"b:8000"}', now - 60) == ("pending", "")
    assert await fire('{"instance":"c:8000"}', now - 30) == ("deferred", "budget")  # a third in the hour
    assert len(await store.action_runs()) == 4  # the resolution planned nothing
