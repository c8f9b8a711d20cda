"""The rule engine: (rule, source result, thresholds, previous states, now) -> (new states, events).

Pure: no I/O, no clock of its own. Per rule and per series (the rule's ``group_by`` labels) a state
machine moves inactive -> pending -> firing -> resolved, following Prometheus where it has rules:

- a *breach* starts ``pending``; the series fires once the breach has lasted ``for`` and
  ``consecutive`` evaluations in a row have breached (``for: 0`` and ``consecutive: 1`` fire at once).
  A gap in the series' data longer than ``max_gap`` (the rule's window) restarts the ``for`` clock:
  one breach at midnight and one at 8 a.m. are not ten minutes of breach;
- an *ok* evaluation clears a pending series and resolves a firing one once it has been ok for
  ``keep_firing_for``, counted from the first ok evaluation (Prometheus's ``keep_firing_for``);
- *no data* is per series: a known series without a value this round follows the rule's
  ``no_data`` policy (keep: nothing changes; ok; breach), whatever the other series do. With
  ``no_data: breach`` and no series known at all, one series with no labels stands for "the signal
  is missing";
- an *error* (the query failed, the threshold cannot be known for the series, or its value is
  outside the signal's domain) never changes a state;
- *warming up* (the source, or the target a series comes from, has not got enough samples yet to
  say anything) never changes a state either.

A series absent for ``forget_after`` is forgotten; a pending or firing one is closed out first
(``inactive`` / ``resolved`` events), so whatever its actions changed is undone.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from specguard.common.evolve import evolve
from specguard.rules.conditions import Condition
from specguard.rules.schema import NoDataPolicy
from specguard.sources.base import SourceResult
from specguard.store.records import SCHEDULE, Event, SeriesState, State, Verdict


@dataclass(frozen=True)
class RuleSpec:
    """What the engine needs of a rule."""

    name: str
    condition: Condition
    for_seconds: float = 0.0
    keep_firing_for: float = 0.0
    consecutive: int = 1
    no_data: NoDataPolicy = NoDataPolicy.KEEP
    max_gap: float = math.inf  # a longer gap in a series' data restarts its `for` clock
    forget_after: float = math.inf  # a series absent this long is forgotten


@dataclass(frozen=True)
class Outcome:
    states: dict[str, SeriesState]
    events: list[Event]
    verdicts: dict[str, Verdict]  # verdict per series key this evaluation
    error: str | None = None  # rule-level error (query failed, threshold unknown)
    forgotten: list[str] = field(default_factory=list)  # series keys dropped as stale


def series_key(labels: Mapping[str, str]) -> str:
    """A stable identity for a label set: its labels as compact JSON, sorted by name."""
    return _key(tuple(sorted(labels.items())))


@functools.lru_cache(maxsize=1 << 16)
def _key(items: tuple[tuple[str, str], ...]) -> str:
    # The same few thousand label sets come back every evaluation (a fleet's round asks for every
    # series of every rule): their JSON is made once.
    return json.dumps(dict(items), separators=(",", ":"))


MISSING_SERIES = series_key({})

Threshold = float | str  # the number to compare with, or why it cannot be known
ThresholdFor = Callable[[Mapping[str, str]], Threshold]


def evaluate(
    rule: RuleSpec,
    result: SourceResult,
    threshold: Threshold | ThresholdFor,
    previous: Mapping[str, SeriesState],
    now: float,
    trigger: str = SCHEDULE,
) -> Outcome:
    """One evaluation.

    ``threshold`` is the number to compare with, an error message for the whole rule, or a function
    of a series' labels giving either (a baseline per model). ``trigger`` says what asked for the
    evaluation; events and changed states carry it.
    """
    rule_error = (
        result.error if result.error is not None else (threshold if isinstance(threshold, str) else None)
    )
    if rule_error is not None:
        states = {
            key: evolve(old, verdict=Verdict.ERROR, error=rule_error, last_eval=now)
            for key, old in previous.items()
        }
        return Outcome(states, [], dict.fromkeys(states, Verdict.ERROR), rule_error)

    def threshold_of(labels: Mapping[str, str]) -> Threshold:
        return threshold(labels) if callable(threshold) else float(threshold)

    step = _Stepper(rule, now, trigger)
    observed = {series_key(s.labels): s for s in result.series}
    invalid = {series_key(s.labels): s for s in result.invalid}

    for key, series in observed.items():
        old = previous.get(key)
        if result.is_warming(series.labels):
            if old is not None:
                step.warming(key, old)
            continue
        found = threshold_of(series.labels)
        old = old or SeriesState(labels=dict(series.labels))
        if isinstance(found, str):
            step.error(key, old, found, seen=True)
        else:
            verdict = Verdict.BREACH if rule.condition.breached(series.value, found) else Verdict.OK
            step.data(key, old, verdict, series.value, found)

    for key, bad in invalid.items():
        if key in observed:
            continue
        step.error(key, previous.get(key) or SeriesState(labels=dict(bad.labels)), bad.reason, seen=True)

    for key, old in previous.items():
        if key in observed or key in invalid:
            continue
        if result.is_warming(old.labels):
            step.warming(key, old)
        elif key == MISSING_SERIES and observed:
            step.missing_series_answered(key, old)
        elif key != MISSING_SERIES and now - _last_seen(old) >= rule.forget_after:
            step.forget(key, old)
        else:
            found = threshold_of(old.labels)
            step.no_data(key, old, found if not isinstance(found, str) else None)

    if (
        not previous
        and not observed
        and not invalid
        and not result.warming
        and rule.no_data is NoDataPolicy.BREACH
    ):
        step.no_data(MISSING_SERIES, SeriesState(labels={}), None)
    return Outcome(step.states, step.events, step.verdicts, None, step.forgotten)


def _last_seen(state: SeriesState) -> float:
    for moment in (state.last_seen, state.last_eval, state.since):
        if moment is not None:
            return moment
    return -math.inf


class _Stepper:
    """Moves series one at a time, collecting new states, events and verdicts."""

    def __init__(self, rule: RuleSpec, now: float, trigger: str) -> None:
        self.rule = rule
        self.now = now
        self.trigger = trigger
        self.states: dict[str, SeriesState] = {}
        self.events: list[Event] = []
        self.verdicts: dict[str, Verdict] = {}
        self.forgotten: list[str] = []

    def warming(self, key: str, old: SeriesState) -> None:
        self._keep(
            key, evolve(old, verdict=Verdict.WARMING_UP, error=None, last_eval=self.now, last_seen=self.now)
        )

    def error(self, key: str, old: SeriesState, message: str, seen: bool) -> None:
        if seen:
            self._keep(
                key, evolve(old, verdict=Verdict.ERROR, error=message, last_eval=self.now, last_seen=self.now)
            )
        else:
            self._keep(key, evolve(old, verdict=Verdict.ERROR, error=message, last_eval=self.now))

    def data(self, key: str, old: SeriesState, verdict: Verdict, value: float, threshold: float) -> None:
        # A long gap in the data restarts the clock of a breach that is still pending.
        gap = old.last_data is not None and self.now - old.last_data > self.rule.max_gap
        if gap and old.state is State.PENDING:
            old = evolve(old, breach_since=None, consecutive=0)
        self._move(key, old, verdict, verdict, value, threshold, seen=True)

    def no_data(self, key: str, old: SeriesState, threshold: float | None) -> None:
        if old.last_seen is None and key != MISSING_SERIES:
            # A series restored from an older store: its absence is counted from its last evaluation.
            old = evolve(old, last_seen=old.last_eval if old.last_eval is not None else self.now)
        effective = {
            NoDataPolicy.KEEP: Verdict.NO_DATA,
            NoDataPolicy.OK: Verdict.OK,
            NoDataPolicy.BREACH: Verdict.BREACH,
        }[self.rule.no_data]
        self._move(key, old, Verdict.NO_DATA, effective, None, threshold)

    def missing_series_answered(self, key: str, old: SeriesState) -> None:
        """Data is back: "the signal is missing" resolves now and is forgotten next time."""
        if old.state in (State.PENDING, State.FIRING):
            closing = RuleSpec(self.rule.name, self.rule.condition)  # no keep_firing_for
            self._move(key, old, Verdict.NO_DATA, Verdict.OK, None, old.threshold, closing)
        else:
            self.forgotten.append(key)

    def forget(self, key: str, old: SeriesState) -> None:
        self.forgotten.append(key)
        if old.state is State.FIRING:
            self._event(key, old.labels, old.state, State.RESOLVED, None, old.threshold, None)
        elif old.state is State.PENDING:
            self._event(key, old.labels, old.state, State.INACTIVE, None, old.threshold, None)
        self.verdicts[key] = Verdict.NO_DATA

    def _keep(self, key: str, new: SeriesState) -> None:
        self.states[key] = new
        assert new.verdict is not None
        self.verdicts[key] = new.verdict

    def _event(
        self,
        key: str,
        labels: Mapping[str, str],
        previous: State,
        state: State,
        value: float | None,
        threshold: float | None,
        since: float | None,
    ) -> None:
        self.events.append(
            Event(
                self.rule.name, key, labels, state, previous, self.now, value, threshold, self.trigger, since
            )
        )

    def _move(
        self,
        key: str,
        old: SeriesState,
        verdict: Verdict,
        effective: Verdict,
        value: float | None,
        threshold: float | None,
        rule: RuleSpec | None = None,
        seen: bool = False,
    ) -> None:
        """``old`` judged ``verdict`` (``effective``: what it counts as, after the no-data policy),
        its transitions recorded as events; the new state made once, from every change at once
        (``seen``: the source answered for the series)."""
        rule = rule or self.rule
        now = self.now
        changes: dict[str, object] = {
            "verdict": verdict, "value": value, "threshold": threshold, "error": None, "last_eval": now,
        }  # fmt: skip
        if seen:
            changes["last_data"] = changes["last_seen"] = now
        self.verdicts[key] = verdict
        state, breach_since = old.state, old.breach_since

        def enter(to: State) -> None:
            nonlocal state
            self._event(
                key, old.labels, state, to, value, threshold, breach_since if to is State.FIRING else None
            )
            changes.update(state=to, since=now, moved_by=self.trigger)
            state = to

        if effective is Verdict.BREACH:
            consecutive = old.consecutive + 1
            changes.update(consecutive=consecutive, last_breach=now, ok_since=None)
            if state in (State.INACTIVE, State.RESOLVED):
                enter(State.PENDING)
                breach_since = changes["breach_since"] = now
            elif breach_since is None:
                breach_since = changes["breach_since"] = now
            started = breach_since if breach_since is not None else now
            if (
                state is State.PENDING
                and now - started >= rule.for_seconds
                and consecutive >= rule.consecutive
            ):
                enter(State.FIRING)
        elif effective is Verdict.OK:
            changes.update(consecutive=0, breach_since=None)
            if state is State.PENDING:
                enter(State.INACTIVE)
            elif state is State.FIRING:
                ok_since = old.ok_since if old.ok_since is not None else now
                if now - ok_since >= rule.keep_firing_for:
                    enter(State.RESOLVED)
                    changes["ok_since"] = None
                else:
                    changes["ok_since"] = ok_since
        self.states[key] = evolve(old, **changes)
