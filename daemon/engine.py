"""The rule engine: (rule, source result, previous states, now) -> (new states, events).

Pure: no I/O, no clock of its own. Per rule and per series (the rule's ``group_by`` labels) a state
machine moves inactive -> pending -> firing -> resolved:

- a *breach* starts ``pending``; the series fires once the breach has lasted ``for`` and
  ``consecutive`` evaluations in a row have breached (``for: 0`` and ``consecutive: 1`` fire at once);
- an *ok* evaluation clears a pending series and resolves a firing one, unless the last breach is
  more recent than ``keep_firing_for``;
- *no data* follows the rule's ``no_data`` policy: keep (nothing changes), ok, or breach;
- an *error* (the query failed, or the threshold is unknown) never changes a state.

Series: when the whole result is empty, every known series has no data; with ``no_data: breach``
and no known series, one series with no labels stands for "the signal is missing". When the
result has data but not for a known series, that series is gone (vLLM restarted under another name,
an engine removed): a firing one resolves and it is then forgotten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from daemon.sources.base import SourceResult
from rules.conditions import Condition
from rules.schema import NoDataPolicy


class State(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class Verdict(StrEnum):
    BREACH = "breach"
    OK = "ok"
    NO_DATA = "no_data"
    ERROR = "error"


@dataclass(frozen=True)
class RuleSpec:
    """What the engine needs of a rule."""

    name: str
    condition: Condition
    for_seconds: float = 0.0
    keep_firing_for: float = 0.0
    consecutive: int = 1
    no_data: NoDataPolicy = NoDataPolicy.KEEP


@dataclass(frozen=True)
class SeriesState:
    labels: Mapping[str, str]
    state: State = State.INACTIVE
    since: float | None = None  # when the current state began
    breach_since: float | None = None  # start of the current run of breaches
    last_breach: float | None = None
    consecutive: int = 0  # breaching evaluations in a row
    verdict: Verdict | None = None
    value: float | None = None
    threshold: float | None = None
    error: str | None = None
    last_eval: float | None = None


@dataclass(frozen=True)
class Event:
    """A state transition of one series."""

    rule: str
    series: str
    labels: Mapping[str, str]
    kind: State  # the state entered
    previous: State
    at: float
    value: float | None
    threshold: float | None


@dataclass(frozen=True)
class Outcome:
    states: dict[str, SeriesState]
    events: list[Event]
    verdicts: dict[str, Verdict]  # verdict per series key this evaluation
    error: str | None = None  # rule-level error (query failed, threshold unknown)


def series_key(labels: Mapping[str, str]) -> str:
    """A stable identity for a label set."""
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"))


MISSING_SERIES = series_key({})


def evaluate(
    rule: RuleSpec,
    result: SourceResult,
    threshold: float | str,
    previous: Mapping[str, SeriesState],
    now: float,
) -> Outcome:
    """One evaluation. ``threshold`` is the number to compare with, or an error message."""
    events: list[Event] = []
    states: dict[str, SeriesState] = {}
    verdicts: dict[str, Verdict] = {}
    error = result.error if result.error is not None else (threshold if isinstance(threshold, str) else None)
    number = threshold if isinstance(threshold, float | int) else None

    if error is not None:
        for key, old in previous.items():
            states[key] = replace(old, verdict=Verdict.ERROR, error=error, last_eval=now)
            verdicts[key] = Verdict.ERROR
        return Outcome(states, events, verdicts, error)

    assert number is not None
    observed = {series_key(s.labels): s for s in result.series}
    for key, series in observed.items():
        old = previous.get(key) or SeriesState(labels=dict(series.labels))
        verdict = Verdict.BREACH if rule.condition.breached(series.value, number) else Verdict.OK
        states[key] = _step(rule, old, verdict, series.value, number, now, events, key)
        verdicts[key] = verdict

    if not observed:
        known = dict(previous)
        if not known and rule.no_data is NoDataPolicy.BREACH:
            known[MISSING_SERIES] = SeriesState(labels={})
        for key, old in known.items():
            states[key] = _step(rule, old, Verdict.NO_DATA, None, number, now, events, key)
            verdicts[key] = Verdict.NO_DATA
    else:
        for key, old in previous.items():
            if key in observed:
                continue
            if old.state in (State.PENDING, State.FIRING):
                # gone while active: close it out this time, forget it next time
                states[key] = _step(
                    RuleSpec(rule.name, rule.condition),
                    old,
                    Verdict.OK,
                    None,
                    number,
                    now,
                    events,
                    key,
                )
                verdicts[key] = Verdict.NO_DATA
    return Outcome(states, events, verdicts)


def _step(
    rule: RuleSpec,
    old: SeriesState,
    verdict: Verdict,
    value: float | None,
    threshold: float,
    now: float,
    events: list[Event],
    key: str,
) -> SeriesState:
    effective = verdict
    if verdict is Verdict.NO_DATA:
        effective = {
            NoDataPolicy.KEEP: Verdict.NO_DATA,
            NoDataPolicy.OK: Verdict.OK,
            NoDataPolicy.BREACH: Verdict.BREACH,
        }[rule.no_data]
    new = replace(old, verdict=verdict, value=value, threshold=threshold, error=None, last_eval=now)

    def enter(series: SeriesState, state: State, **changes: float | None) -> SeriesState:
        events.append(Event(rule.name, key, series.labels, state, series.state, now, value, threshold))
        return replace(series, state=state, since=now, **changes)  # type: ignore[arg-type]

    if effective is Verdict.BREACH:
        new = replace(new, consecutive=old.consecutive + 1, last_breach=now)
        if new.state in (State.INACTIVE, State.RESOLVED):
            new = enter(new, State.PENDING, breach_since=now)
        started = new.breach_since if new.breach_since is not None else now
        if (
            new.state is State.PENDING
            and now - started >= rule.for_seconds
            and new.consecutive >= rule.consecutive
        ):
            new = enter(new, State.FIRING)
        return new

    if effective is Verdict.OK:
        new = replace(new, consecutive=0, breach_since=None)
        if new.state is State.PENDING:
            return enter(new, State.INACTIVE)
        if new.state is State.FIRING:
            last = old.last_breach if old.last_breach is not None else now
            if rule.keep_firing_for > 0 and now - last < rule.keep_firing_for:
                return new
            return enter(new, State.RESOLVED)
        return new

    return new  # no data, kept as it is
