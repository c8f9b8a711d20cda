"""The first phase: each rule evaluated at every moment of the period, as the daemon evaluates it.

``evaluate_rule`` is the daemon's own (its reading, the pure engine, the sequential detector), given
the states the previous evaluation left and the simulated moment; the source answers for that
moment. Every event is kept (the episodes are made of them); the evaluations whose events the dispatcher acts
on (a firing, a resolution: ``dispatch.planning.ACTIONABLE``) are kept whole for the second phase
(``act.py``), since a series going pending or back to inactive changes nothing any action or guard
reads; what every series read and where it stood is kept as a compact trace for the page, the
calibration and the summary.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from specguard.backtest.plan import Plan
from specguard.daemon.evaluation import evaluate_rule
from specguard.dispatch.planning import ACTIONABLE
from specguard.engine.states import Outcome
from specguard.sources.base import Source, SourceResult
from specguard.store.baseline import Baseline
from specguard.store.records import Event, SeriesState, State

STATES = tuple(State)  # a state's code in a trace is its index here


@dataclass
class Trace:
    """One series of one rule: at each evaluation, its value, its threshold and its state."""

    labels: dict[str, str]
    at: array[float] = field(default_factory=lambda: array("d"))
    value: array[float] = field(default_factory=lambda: array("d"))  # NaN: no value
    threshold: array[float] = field(default_factory=lambda: array("d"))
    state: bytearray = field(default_factory=bytearray)

    def add(self, at: float, series: SeriesState) -> None:
        self.at.append(at)
        self.value.append(math.nan if series.value is None else series.value)
        self.threshold.append(math.nan if series.threshold is None else series.threshold)
        self.state.append(STATES.index(series.state))


@dataclass
class Moment:
    """An evaluation the second phase replays: what the engine decided, from which states."""

    at: float
    previous: Mapping[str, SeriesState]
    outcome: Outcome
    result: SourceResult


@dataclass
class Judged:
    plan: Plan
    moments: list[Moment] = field(default_factory=list)  # the evaluations the dispatcher acts on
    events: list[Event] = field(default_factory=list)  # every event, in order
    traces: dict[str, Trace] = field(default_factory=dict)
    final: dict[str, SeriesState] = field(default_factory=dict)
    evaluations: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # a rule-level error -> evaluations it lasted


def moments(start: float, end: float, every: float) -> list[float]:
    """The evaluation moments in [start, end]: multiples of ``every`` from the epoch, as a daemon's
    schedule of that interval falls on whole minutes."""
    first = math.ceil(start / every - 1e-9) * every
    count = max(0, math.floor((end - first) / every + 1e-9) + 1)
    return [first + i * every for i in range(count)]


async def judge(
    plan: Plan,
    source: Source,
    baseline: Baseline | None,
    start: float,
    end: float,
    set_clock: Callable[[float], None],
) -> Judged:
    """``plan``'s rule evaluated at each of its moments in [start, end]."""
    judged = Judged(plan)
    if plan.skip is not None:
        return judged
    item, every = plan.item, plan.every
    states: dict[str, SeriesState] = {}
    traces = judged.traces
    errors = judged.errors
    for at in moments(start, end, every):
        set_clock(at)
        outcome, result = await evaluate_rule(item, source, baseline, states, at, every)
        judged.evaluations += 1
        if outcome.events:
            judged.events.extend(outcome.events)
            if any(event.kind in ACTIONABLE for event in outcome.events):
                judged.moments.append(Moment(at, states, outcome, result))
        if outcome.error is not None:
            errors[outcome.error] = errors.get(outcome.error, 0) + 1
        for key, series in outcome.states.items():
            trace = traces.get(key)
            if trace is None:
                trace = traces[key] = Trace(dict(series.labels))
            trace.add(at, series)
        states = outcome.states
    judged.final = states
    return judged
