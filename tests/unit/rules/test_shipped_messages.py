"""Every shipped rule, walked through every transition the engine makes, says nothing its value does
not show: a message that claims a breach comes with a value that breaches the rule's condition, a
recovery with one that does not, and a move without a value says it has none.

The walk runs the real engine (``engine.states.evaluate``) on each rule's own spec, under each
no-data policy an operator may set, and takes each event's message from the path the log, Slack,
``history`` and the report read (``daemon.dispatch.describe``). What a message may claim is derived
from the rule's condition and the event's value, never from the words of the messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import pytest

from specguard.config.loading import LoadedRule, load
from specguard.daemon.evaluation import spec_of
from specguard.dispatch import describe
from specguard.engine.states import evaluate, series_key
from specguard.rules.conditions import Condition
from specguard.rules.messages import Wording, default, fields, given, message
from specguard.rules.schema import NoDataPolicy, Rule
from specguard.rules.templates import render
from specguard.sources.base import Series, SourceResult
from specguard.store.records import Event, SeriesState, State

INTERVAL = 15.0  # the config's evaluation interval, for rules without their own
LABELS = {"instance": "a:8000", "model_name": "m"}
KEY = series_key(LABELS)
BASELINE = 0.5  # what a baseline-relative condition's baseline holds


def shipped() -> list[LoadedRule]:
    loaded = load(None, ["builtin:speculative"])
    assert loaded.ok, loaded.errors
    return loaded.rules


def variant(item: LoadedRule, **changes: object) -> LoadedRule:
    """``item``'s rule as its file would say it with ``changes`` (None: the key left out)."""
    raw = {**item.rule.model_dump(by_alias=True, exclude_unset=True), **changes}
    rule = Rule.model_validate({key: value for key, value in raw.items() if value is not None})
    return LoadedRule(rule, item.file, item.line)


def with_only_summary(item: LoadedRule) -> LoadedRule:
    """The rule as an old config wrote it: one summary, worded for the firing."""
    return variant(item, messages=None, annotations={"summary": item.rule.messages.still_breaching})


def with_no_messages(item: LoadedRule) -> LoadedRule:
    return variant(item, messages=None, annotations=None)


ALERT_RULE = LoadedRule(
    Rule.model_validate({"name": "am_low", "alert": {"match": {"alertname": "AcceptanceLow"}}}), "r.yaml", 1
)


def with_policy(item: LoadedRule, policy: NoDataPolicy) -> LoadedRule:
    return variant(item, no_data=policy.value)


def threshold_of(condition: Condition) -> float:
    if condition.baseline_signal is not None:
        return condition.threshold({condition.baseline_signal: BASELINE})
    return condition.threshold(None)


def values(condition: Condition, threshold: float) -> tuple[float, float]:
    """A value that breaches the condition and one that does not, chosen by the condition."""
    near = (threshold * 0.9, threshold * 1.05, threshold - 1, threshold + 1)
    breaching = next(v for v in near if condition.breached(v, threshold))
    ok = next(v for v in near if not condition.breached(v, threshold))
    return breaching, ok


Seen = Literal["breach", "ok", "absent", "nothing"]


@dataclass
class Said:
    event: Event
    text: str
    wording: Wording
    default: bool
    breaching_in_a_row: int  # the walk's own count of breaching observations before the event


@dataclass
class Walk:
    """One rule fed evaluations by a fake clock: the series breaches, is ok, is absent (other
    series report), or nothing reports at all."""

    item: LoadedRule
    said: list[Said] = field(default_factory=list)
    states: dict[str, SeriesState] = field(default_factory=dict)
    now: float = 1_800_000_000.0
    in_a_row: int = 0

    def __post_init__(self) -> None:
        self.spec = spec_of(self.item, INTERVAL)
        self.every = self.item.rule.interval or INTERVAL
        self.threshold = threshold_of(self.spec.condition)
        self.breaching, self.ok = values(self.spec.condition, self.threshold)

    @property
    def holds(self) -> bool:
        """Whether a breach pends before it fires (else pending and firing come at once)."""
        return self.spec.for_seconds > 0 or self.spec.consecutive > 1

    def step(self, seen: Seen, after: float | None = None) -> list[Event]:
        self.now += self.every if after is None else after
        series: tuple[Series, ...] = ()
        if seen in ("breach", "ok"):
            series = (Series(LABELS, self.breaching if seen == "breach" else self.ok),)
        elif seen == "absent":
            series = (Series({"instance": "elsewhere:8000", "model_name": "m"}, self.ok),)
        outcome = evaluate(self.spec, SourceResult(series=series), self.threshold, self.states, self.now)
        self.states = {k: v for k, v in outcome.states.items() if k not in outcome.forgotten}
        for event in outcome.events:
            said = message(
                self.item.rule,
                kind=event.kind.value,
                previous=event.previous.value,
                value=event.value,
                threshold=event.threshold,
                labels=event.labels,
            )
            summary, annotations = describe(self.item, event)
            assert summary == said.text  # what the log, Slack, history and the report get
            if "summary" in annotations:
                assert annotations["summary"] == said.text
            self.said.append(Said(event, said.text, said.wording, said.default, self.in_a_row))
        self.in_a_row = self.in_a_row + 1 if seen == "breach" else 0
        return outcome.events

    def until(self, seen: Seen, kind: State, after: float | None = None, series: str = KEY) -> None:
        """Feed ``seen`` until the series enters ``kind``."""
        for _ in range(2000):
            if any(e.kind is kind and e.series == series for e in self.step(seen, after)):
                return
        raise AssertionError(f"{self.item.name}: {seen} never moved {series} to {kind}")


def walk(item: LoadedRule) -> Walk:
    """Every transition the engine makes for ``item`` under its no-data policy."""
    w = Walk(item)
    w.until("breach", State.FIRING)  # inactive -> pending (-> firing)
    w.until("ok", State.RESOLVED)  # firing -> resolved
    w.until("breach", State.PENDING)  # resolved -> pending
    if w.holds:
        w.until("ok", State.INACTIVE)  # pending -> inactive
    else:
        w.until("ok", State.RESOLVED)  # it fired with the breach: a pending series never clears
    policy = item.rule.no_data
    if policy is NoDataPolicy.BREACH:
        w.until("absent", State.FIRING)  # missing data is the breach: pending, firing
        w.until("absent", State.RESOLVED, after=w.spec.forget_after)  # gone: forgotten
        # nothing reports the signal at all: the "signal missing" series, closed when data is back
        missing = Walk(item)
        missing.until("nothing", State.FIRING, series=series_key({}))
        missing.until("breach", State.RESOLVED, series=series_key({}))
        w.said += missing.said
        return w
    # keep: a series gone for forget_after is closed out; ok: missing data is ok
    gone = w.spec.forget_after if policy is NoDataPolicy.KEEP else None
    if w.holds:
        w.until("breach", State.PENDING)
        w.until("absent", State.INACTIVE, after=gone)
    w.until("breach", State.FIRING)
    w.until("absent", State.RESOLVED, after=gone)
    return w


def variants() -> Iterator[tuple[str, LoadedRule]]:
    for item in shipped():
        for policy in NoDataPolicy:
            yield f"{item.name}-no_data_{policy.value}", with_policy(item, policy)
            yield (
                f"{item.name}-only_summary-no_data_{policy.value}",
                with_policy(with_only_summary(item), policy),
            )
            yield (
                f"{item.name}-no_messages-no_data_{policy.value}",
                with_policy(with_no_messages(item), policy),
            )
    for policy in NoDataPolicy:
        yield f"alert_rule-no_data_{policy.value}", with_policy(ALERT_RULE, policy)


VARIANTS = dict(variants())


@pytest.mark.parametrize("name", VARIANTS)
def test_no_message_claims_a_breach_its_value_does_not_show(name: str) -> None:
    item = VARIANTS[name]
    w = walk(item)
    condition = w.spec.condition
    for said in w.said:
        event = said.event
        where = f"{item.name}: {event.previous} -> {event.kind} at {event.value}: {said.text!r}"
        if event.value is None:
            assert said.wording is Wording.NO_DATA, where
            continue
        assert event.threshold is not None
        shows_breach = condition.breached(event.value, event.threshold)
        assert said.wording.claims_breach == shows_breach, where
        if said.wording is Wording.STILL_BREACHING:
            # what a firing may say besides: the breach lasted `for`, `consecutive` evaluations
            assert event.since is not None and event.at - event.since >= item.rule.for_, where
            assert said.breaching_in_a_row + 1 >= item.rule.consecutive, where
        if not said.wording.claims_breach:
            # nor is it worded as the rule's breach would be, at this very value
            known = fields(item.rule, event.kind.value, event.previous.value, event.value, event.labels)
            for claim in (Wording.BREACH, Wording.STILL_BREACHING):
                template = given(item.rule, claim) or default(
                    item.rule, claim, event.kind.value, event.labels
                )
                breach_text = render(
                    template, labels=event.labels, value=event.value, threshold=event.threshold, **known
                )
                assert said.text != breach_text, where


@pytest.mark.parametrize("name", VARIANTS)
def test_the_walk_reaches_every_wording(name: str) -> None:
    w = walk(VARIANTS[name])
    assert {s.wording for s in w.said} == set(Wording)
    moves = {(s.event.previous, s.event.kind) for s in w.said}
    assert {(State.INACTIVE, State.PENDING), (State.PENDING, State.FIRING)} <= moves
    assert {(State.FIRING, State.RESOLVED), (State.RESOLVED, State.PENDING)} <= moves
    if w.holds:
        assert (State.PENDING, State.INACTIVE) in moves


@pytest.mark.parametrize("item", shipped(), ids=lambda item: item.name)
def test_each_shipped_rule_words_every_transition_itself(item: LoadedRule) -> None:
    for policy in NoDataPolicy:
        said = walk(with_policy(item, policy)).said
        assert said and not [s.text for s in said if s.default]
    messages = item.rule.messages
    assert None not in (messages.breach, messages.still_breaching, messages.recovered, messages.no_data)
