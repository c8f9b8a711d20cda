"""An outcome that pages (``Outcome.page``): on-call hears of it through the observing actions even
when the run is not over (a restart deferred because the fleet's store is down), and when it went
well (a step done after its fleet slot had ended); an outcome that does not page tells nothing
until the run is over."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome
from specguard.config.loading import LoadedRule
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.schema import Rule
from specguard.store.database import Store
from specguard.store.records import Event, RunOutcome, SeriesState, State


class Disrupting(Action):
    type = "disrupting"
    changes_world = True
    outcomes: ClassVar[list[Outcome]] = []

    async def run(self, ctx: ActionContext) -> Outcome:
        return Disrupting.outcomes.pop(0)


class Listening(Action):
    type = "listening"
    observes = True
    heard: ClassVar[list[RunOutcome]] = []

    async def run(self, ctx: ActionContext) -> Outcome:
        return Outcome(True, "told")

    async def observe(self, outcome: RunOutcome, memory: ActionMemory) -> None:
        Listening.heard.append(outcome)


@pytest.fixture(autouse=True)
def _reset() -> None:
    Disrupting.outcomes, Listening.heard = [], []


def rule() -> LoadedRule:
    raw: dict[str, Any] = {"name": "low", "signal": "acceptance_rate", "condition": "< 0.5",
                           "actions": ["shrink", "oncall"]}  # fmt: skip
    return LoadedRule(Rule.model_validate(raw), "rules.yaml", 2)


async def fired(store: Store) -> tuple[Dispatcher, list[int]]:
    actions: dict[str, Action] = {
        "shrink": Disrupting("shrink", ActionParams(type="disrupting")),
        "oncall": Listening("oncall", ActionParams(type="listening")),
    }
    d = Dispatcher(store, actions, False, DaemonMetrics())
    labels = {"instance": "h:8000"}
    event = Event("low", '{"instance":"h:8000"}', labels, State.FIRING, State.PENDING, 100.0, 0.2, 0.5)
    state = SeriesState(labels=labels, state=event.kind, since=event.at)
    item = rule()
    return d, await store.commit_evaluation(item.name, {event.series: state}, [d.record(item, event)])


async def test_a_deferral_that_pages_is_told_at_once_and_one_that_does_not_is_not(store: Store) -> None:
    Disrupting.outcomes = [
        Outcome(False, "deferred: 2 of 2 slots held by a:shrink, b:shrink", retry_after=5.0),
        Outcome(False, "deferred: the fleet's redis cannot be reached", retry_after=5.0, page=True),
    ]
    d, pending = await fired(store)
    await d.run(pending)
    assert Listening.heard == []  # an ordinary deferral: nothing to tell yet; the run waits, pending again
    (run,) = [r for r in await store.action_runs() if r["action"] == "shrink"]
    assert (run["status"], run["detail"]) == ("pending", "deferred: 2 of 2 slots held by a:shrink, b:shrink")

    d.clock = lambda: 1e12  # the retry is due
    await d.run()
    (told,) = Listening.heard
    assert (told.action, told.status, told.page) == ("shrink", "deferred", True)
    assert told.detail == "deferred: the fleet's redis cannot be reached"


async def test_a_step_that_went_well_but_pages_is_told_with_its_page(store: Store) -> None:
    Disrupting.outcomes = [
        Outcome(True, "k 4 -> 2: ...; done without a fleet slot: its lease ran out", page=True)
    ]
    d, pending = await fired(store)
    await d.run(pending)
    (told,) = Listening.heard
    assert (told.status, told.page) == ("ok", True) and "done without a fleet slot" in told.detail
