"""The rule engine: a pure state machine per rule and series, driven with a fake clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from specguard.engine.states import MISSING_SERIES, Outcome, RuleSpec, evaluate, series_key
from specguard.rules.conditions import parse_condition
from specguard.rules.schema import NoDataPolicy
from specguard.rules.signals import get_signal
from specguard.sources.base import Invalid, Series, SourceResult
from specguard.store.records import Event, SeriesState, State, Verdict

A = {"instance": "a:8000", "model_name": "m"}
B = {"instance": "b:8000", "model_name": "m"}
KEY_A = series_key(A)
KEY_B = series_key(B)
THRESHOLD = 0.5
LOW = 0.2  # breaches "< 0.5"
HIGH = 0.9  # ok for "< 0.5"


def spec(**changes: object) -> RuleSpec:
    """A rule "acceptance < 0.5" with the given timing and no-data policy."""
    return RuleSpec(name="acceptance_low", condition=parse_condition("< 0.5"), **changes)  # type: ignore[arg-type]


def data(*items: tuple[Mapping[str, str], float]) -> SourceResult:
    return SourceResult.of(items)


EMPTY = SourceResult()


class Clock:
    """Feeds evaluations one after the other, carrying the states along."""

    def __init__(self, rule: RuleSpec, states: Mapping[str, SeriesState] | None = None):
        self.rule = rule
        self.states: dict[str, SeriesState] = dict(states or {})
        self.events: list[Event] = []

    def at(self, now: float, result: SourceResult, threshold: float | str = THRESHOLD) -> Outcome:
        outcome = evaluate(self.rule, result, threshold, self.states, now)
        self.states = outcome.states
        self.events.extend(outcome.events)
        return outcome

    def state(self, key: str = KEY_A) -> State:
        return self.states[key].state


def kinds(events: Sequence[Event]) -> list[State]:
    return [event.kind for event in events]


# --- basic transitions ------------------------------------------------------------------------


def test_a_breach_with_for_goes_pending_then_fires_once_for_has_elapsed() -> None:
    clock = Clock(spec(for_seconds=60))
    first = clock.at(0, data((A, LOW)))
    assert clock.state() is State.PENDING
    assert [(e.kind, e.previous) for e in first.events] == [(State.PENDING, State.INACTIVE)]
    assert first.verdicts == {KEY_A: Verdict.BREACH}

    assert clock.at(30, data((A, LOW))).events == []
    assert clock.state() is State.PENDING

    fired = clock.at(60, data((A, LOW)))
    assert clock.state() is State.FIRING
    assert [(e.kind, e.previous) for e in fired.events] == [(State.FIRING, State.PENDING)]
    event = fired.events[0]
    assert (event.rule, event.series, dict(event.labels)) == ("acceptance_low", KEY_A, A)
    assert (event.at, event.value, event.threshold) == (60, LOW, THRESHOLD)
    assert event.since == 0  # the firing tells when its breach began (the message says "since")
    assert first.events[0].since is None  # only a firing does
    assert clock.states[KEY_A].since == 60


def test_for_zero_fires_in_one_evaluation_with_pending_then_firing_events_in_order() -> None:
    clock = Clock(spec(for_seconds=0))
    outcome = clock.at(100, data((A, LOW)))
    assert [(e.kind, e.previous) for e in outcome.events] == [
        (State.PENDING, State.INACTIVE),
        (State.FIRING, State.PENDING),
    ]
    assert all(e.at == 100 for e in outcome.events)
    assert clock.state() is State.FIRING


def test_a_breach_shorter_than_for_then_ok_goes_back_to_inactive_without_firing() -> None:
    clock = Clock(spec(for_seconds=60))
    clock.at(0, data((A, LOW)))
    clock.at(30, data((A, LOW)))
    outcome = clock.at(45, data((A, HIGH)))
    assert [(e.kind, e.previous) for e in outcome.events] == [(State.INACTIVE, State.PENDING)]
    assert outcome.verdicts == {KEY_A: Verdict.OK}
    assert clock.state() is State.INACTIVE
    assert State.FIRING not in kinds(clock.events)
    assert clock.states[KEY_A].breach_since is None
    assert clock.states[KEY_A].consecutive == 0


def test_the_for_timer_restarts_after_an_ok_evaluation() -> None:
    clock = Clock(spec(for_seconds=60))
    clock.at(0, data((A, LOW)))
    clock.at(50, data((A, HIGH)))
    clock.at(55, data((A, LOW)))
    clock.at(100, data((A, LOW)))  # 100s since the first breach, but only 45s of this run
    assert clock.state() is State.PENDING
    clock.at(115, data((A, LOW)))
    assert clock.state() is State.FIRING


def test_a_firing_series_resolves_on_the_first_ok_evaluation() -> None:
    clock = Clock(spec())
    clock.at(0, data((A, LOW)))
    outcome = clock.at(15, data((A, HIGH)))
    assert [(e.kind, e.previous) for e in outcome.events] == [(State.RESOLVED, State.FIRING)]
    assert outcome.events[0].value == HIGH
    assert clock.state() is State.RESOLVED


def test_keep_firing_for_counts_from_the_first_ok_evaluation_as_prometheus_does() -> None:
    clock = Clock(spec(keep_firing_for=60))
    clock.at(0, data((A, LOW)))
    assert clock.state() is State.FIRING
    assert clock.at(15, data((A, HIGH))).events == []  # ok since 15
    assert clock.at(45, data((A, HIGH))).events == []
    assert clock.state() is State.FIRING
    # a breach inside the spell keeps it firing, with no new event, and ends the ok spell
    assert clock.at(50, data((A, LOW))).events == []
    assert clock.at(100, data((A, HIGH))).events == []  # ok again since 100
    assert clock.at(155, data((A, HIGH))).events == []
    assert clock.state() is State.FIRING
    resolved = clock.at(160, data((A, HIGH)))  # 60s after the first ok evaluation at 100
    assert kinds(resolved.events) == [State.RESOLVED]
    assert clock.state() is State.RESOLVED


def test_keep_firing_for_one_interval_resolves_on_the_second_ok_evaluation() -> None:
    """keep_firing_for: 15s at a 15 s interval is not a no-op: one ok evaluation is not enough."""
    clock = Clock(spec(keep_firing_for=15))
    clock.at(0, data((A, LOW)))
    assert clock.at(15, data((A, HIGH))).events == []
    assert kinds(clock.at(30, data((A, HIGH))).events) == [State.RESOLVED]


def test_consecutive_needs_that_many_breaching_evaluations_in_a_row_even_with_for_zero() -> None:
    clock = Clock(spec(for_seconds=0, consecutive=3))
    assert kinds(clock.at(0, data((A, LOW))).events) == [State.PENDING]
    assert clock.at(60, data((A, LOW))).events == []
    assert clock.state() is State.PENDING
    assert clock.states[KEY_A].consecutive == 2
    assert kinds(clock.at(120, data((A, LOW))).events) == [State.FIRING]


def test_an_ok_evaluation_resets_the_consecutive_count() -> None:
    clock = Clock(spec(for_seconds=0, consecutive=3))
    clock.at(0, data((A, LOW)))
    clock.at(60, data((A, LOW)))
    assert kinds(clock.at(120, data((A, HIGH))).events) == [State.INACTIVE]
    assert clock.states[KEY_A].consecutive == 0
    clock.at(180, data((A, LOW)))
    clock.at(240, data((A, LOW)))
    assert clock.state() is State.PENDING  # only two in a row since the ok
    assert State.FIRING not in kinds(clock.events)
    clock.at(300, data((A, LOW)))
    assert clock.state() is State.FIRING


def test_a_firing_series_does_not_fire_again_while_the_breach_continues() -> None:
    clock = Clock(spec())
    clock.at(0, data((A, LOW)))
    for now in range(15, 300, 15):
        assert clock.at(now, data((A, LOW))).events == []
    assert clock.state() is State.FIRING
    assert clock.states[KEY_A].since == 0
    assert kinds(clock.events) == [State.PENDING, State.FIRING]


def test_a_resolved_series_that_breaches_again_goes_pending_again() -> None:
    clock = Clock(spec(for_seconds=30))
    clock.at(0, data((A, LOW)))
    clock.at(30, data((A, LOW)))
    clock.at(45, data((A, HIGH)))
    assert clock.state() is State.RESOLVED
    outcome = clock.at(60, data((A, LOW)))
    assert [(e.kind, e.previous) for e in outcome.events] == [(State.PENDING, State.RESOLVED)]
    assert clock.states[KEY_A].breach_since == 60
    clock.at(80, data((A, LOW)))
    assert clock.state() is State.PENDING  # the new run needs its own 30s
    assert kinds(clock.at(90, data((A, LOW))).events) == [State.FIRING]


def test_ok_on_an_inactive_series_emits_nothing_and_records_the_evaluation() -> None:
    outcome = Clock(spec()).at(5, data((A, HIGH)))
    assert outcome.events == []
    state = outcome.states[KEY_A]
    assert (state.state, state.verdict, state.value, state.threshold, state.last_eval) == (
        State.INACTIVE,
        Verdict.OK,
        HIGH,
        THRESHOLD,
        5,
    )


def test_an_integer_threshold_is_a_number_not_an_error() -> None:
    outcome = Clock(spec()).at(0, data((A, LOW)), threshold=1)
    assert outcome.error is None
    assert outcome.verdicts == {KEY_A: Verdict.BREACH}


def test_evaluate_does_not_modify_the_previous_states() -> None:
    clock = Clock(spec(for_seconds=60))
    clock.at(0, data((A, LOW)))
    before = dict(clock.states)
    evaluate(clock.rule, data((A, HIGH)), THRESHOLD, before, 10)
    assert before == clock.states
    assert before[KEY_A].state is State.PENDING


# --- no data --------------------------------------------------------------------------------------


def test_no_data_keep_leaves_a_pending_series_and_its_timers_unchanged() -> None:
    clock = Clock(spec(for_seconds=60, no_data=NoDataPolicy.KEEP))
    clock.at(0, data((A, LOW)))
    clock.at(15, data((A, LOW)))
    before = clock.states[KEY_A]
    outcome = clock.at(30, EMPTY)
    after = clock.states[KEY_A]
    assert outcome.events == []
    assert outcome.verdicts == {KEY_A: Verdict.NO_DATA}
    assert outcome.error is None
    assert (after.state, after.since, after.breach_since, after.last_breach, after.consecutive) == (
        before.state,
        before.since,
        before.breach_since,
        before.last_breach,
        before.consecutive,
    )
    assert after.verdict is Verdict.NO_DATA
    assert after.last_eval == 30


def test_no_data_keep_lets_a_pending_series_fire_once_data_returns_breaching_after_for() -> None:
    clock = Clock(spec(for_seconds=60, no_data=NoDataPolicy.KEEP))
    clock.at(0, data((A, LOW)))
    clock.at(20, EMPTY)
    clock.at(40, EMPTY)
    assert clock.state() is State.PENDING
    outcome = clock.at(60, data((A, LOW)))
    assert kinds(outcome.events) == [State.FIRING]


def test_no_data_keep_leaves_a_firing_series_firing() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.KEEP))
    clock.at(0, data((A, LOW)))
    assert clock.at(15, EMPTY).events == []
    assert clock.state() is State.FIRING


def test_no_data_keep_with_no_known_series_creates_nothing() -> None:
    outcome = Clock(spec(no_data=NoDataPolicy.KEEP)).at(0, EMPTY)
    assert (outcome.states, outcome.events, outcome.verdicts, outcome.error) == ({}, [], {}, None)


def test_no_data_ok_resolves_a_firing_series() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.OK))
    clock.at(0, data((A, LOW)))
    outcome = clock.at(15, EMPTY)
    assert [(e.kind, e.previous) for e in outcome.events] == [(State.RESOLVED, State.FIRING)]
    assert outcome.verdicts == {KEY_A: Verdict.NO_DATA}
    assert outcome.events[0].value is None


def test_no_data_ok_clears_a_pending_series() -> None:
    clock = Clock(spec(for_seconds=60, no_data=NoDataPolicy.OK))
    clock.at(0, data((A, LOW)))
    assert kinds(clock.at(15, EMPTY).events) == [State.INACTIVE]


def test_no_data_breach_keeps_a_firing_series_firing_without_a_new_event() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.BREACH))
    clock.at(0, data((A, LOW)))
    outcome = clock.at(15, EMPTY)
    assert outcome.events == []
    assert outcome.verdicts == {KEY_A: Verdict.NO_DATA}
    assert clock.state() is State.FIRING
    assert clock.states[KEY_A].last_breach == 15


def test_no_data_breach_pushes_a_pending_series_to_firing_once_for_has_elapsed() -> None:
    clock = Clock(spec(for_seconds=30, no_data=NoDataPolicy.BREACH))
    clock.at(0, data((A, LOW)))
    clock.at(15, EMPTY)
    assert clock.state() is State.PENDING
    assert kinds(clock.at(30, EMPTY).events) == [State.FIRING]


def test_no_data_breach_with_no_known_series_makes_a_label_less_series_pending_then_firing() -> None:
    assert series_key({}) == MISSING_SERIES
    clock = Clock(spec(for_seconds=30, no_data=NoDataPolicy.BREACH))
    first = clock.at(0, EMPTY)
    assert list(first.states) == [MISSING_SERIES]
    assert dict(first.states[MISSING_SERIES].labels) == {}
    assert first.verdicts == {MISSING_SERIES: Verdict.NO_DATA}
    assert [(e.kind, e.series) for e in first.events] == [(State.PENDING, MISSING_SERIES)]
    assert first.events[0].value is None
    assert clock.at(15, EMPTY).events == []
    fired = clock.at(30, EMPTY)
    assert [(e.kind, e.series) for e in fired.events] == [(State.FIRING, MISSING_SERIES)]


def test_no_data_breach_with_for_zero_fires_the_missing_series_at_once() -> None:
    outcome = Clock(spec(no_data=NoDataPolicy.BREACH)).at(0, EMPTY)
    assert kinds(outcome.events) == [State.PENDING, State.FIRING]
    assert outcome.states[MISSING_SERIES].state is State.FIRING


def test_the_missing_series_resolves_and_is_forgotten_when_real_data_returns() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.BREACH))
    clock.at(0, EMPTY)
    outcome = clock.at(15, data((A, HIGH)))
    assert [(e.kind, e.series) for e in outcome.events] == [(State.RESOLVED, MISSING_SERIES)]
    assert clock.at(30, data((A, HIGH))).states.keys() == {KEY_A}


# --- series that disappear -----------------------------------------------------------------------


def test_a_series_that_goes_quiet_while_others_report_follows_no_data_keep() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.KEEP))
    clock.at(0, data((A, LOW), (B, LOW)))
    assert (clock.state(KEY_A), clock.state(KEY_B)) == (State.FIRING, State.FIRING)
    quiet = clock.at(15, data((B, LOW)))  # A idle: no drafts, so no value
    assert quiet.events == []
    assert quiet.verdicts == {KEY_B: Verdict.BREACH, KEY_A: Verdict.NO_DATA}
    assert clock.state(KEY_A) is State.FIRING  # not resolved because B still reports


def test_a_series_that_goes_quiet_keeps_firing_through_keep_firing_for_under_no_data_ok() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.OK, keep_firing_for=30))
    clock.at(0, data((A, LOW), (B, HIGH)))
    assert clock.at(15, data((B, HIGH))).events == []  # ok for A since 15
    assert kinds(clock.at(45, data((B, HIGH))).events) == [State.RESOLVED]


def test_a_vanished_instance_alerts_under_no_data_breach_while_the_rest_of_the_fleet_reports() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.BREACH, for_seconds=30))
    clock.at(0, data((A, HIGH), (B, HIGH)))
    clock.at(15, data((B, HIGH)))  # A's vLLM died
    assert clock.state(KEY_A) is State.PENDING
    fired = clock.at(45, data((B, HIGH)))
    assert [(e.kind, e.series) for e in fired.events] == [(State.FIRING, KEY_A)]
    assert clock.state(KEY_B) is State.INACTIVE


def test_a_series_absent_for_forget_after_is_closed_out_and_forgotten() -> None:
    clock = Clock(spec(forget_after=300))
    clock.at(0, data((A, LOW), (B, HIGH)))
    assert clock.at(299, data((B, HIGH))).events == []
    assert clock.state(KEY_A) is State.FIRING
    gone = clock.at(300, data((B, HIGH)))
    assert [(e.kind, e.previous, e.series, e.value) for e in gone.events] == [
        (State.RESOLVED, State.FIRING, KEY_A, None)
    ]
    assert gone.forgotten == [KEY_A]
    assert set(gone.states) == {KEY_B}


def test_a_pending_series_is_closed_as_inactive_and_an_inactive_one_silently_when_forgotten() -> None:
    clock = Clock(spec(for_seconds=600, forget_after=60))
    clock.at(0, data((A, LOW), (B, HIGH)))
    gone = clock.at(60, EMPTY)
    assert [(e.kind, e.series) for e in gone.events] == [(State.INACTIVE, KEY_A)]
    assert sorted(gone.forgotten) == sorted([KEY_A, KEY_B])
    assert gone.states == {}


def test_a_known_series_ages_from_the_last_time_the_source_knew_it() -> None:
    clock = Clock(spec(forget_after=100))
    clock.at(0, data((A, LOW)))
    clock.at(90, data((A, LOW)))
    assert clock.at(150, EMPTY).forgotten == []  # 60 s since last seen at 90
    assert clock.at(190, EMPTY).forgotten == [KEY_A]


# --- warming up -----------------------------------------------------------------------------------


def warming(*instances: str, result: SourceResult = EMPTY) -> SourceResult:
    return SourceResult(series=result.series, warming=frozenset(instances))


def test_a_warming_source_changes_no_state_even_with_no_data_breach() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.BREACH))
    outcome = clock.at(0, warming("a:8000", "b:8000"))
    assert (outcome.states, outcome.events) == ({}, [])  # nothing is missing yet


def test_a_restored_firing_series_neither_resolves_nor_fires_again_while_its_target_warms_up() -> None:
    restored = Clock(spec(no_data=NoDataPolicy.OK))
    restored.at(0, data((A, LOW), (B, LOW)))
    after_restart = Clock(spec(no_data=NoDataPolicy.OK), restored.states)
    # the fast target answers; the slow one has not got its second sample yet
    outcome = after_restart.at(100, warming("a:8000", result=data((B, LOW))))
    assert outcome.events == []
    assert outcome.verdicts == {KEY_B: Verdict.BREACH, KEY_A: Verdict.WARMING_UP}
    assert after_restart.state(KEY_A) is State.FIRING
    assert after_restart.at(115, data((A, LOW), (B, LOW))).events == []


def test_a_series_grouped_across_targets_waits_for_every_target() -> None:
    everyone = {"model_name": "m"}
    clock = Clock(spec(no_data=NoDataPolicy.OK))
    clock.at(0, data((everyone, LOW)))
    outcome = clock.at(15, warming("b:8000", result=data((everyone, HIGH))))
    assert outcome.verdicts == {series_key(everyone): Verdict.WARMING_UP}  # a sum over one target of two
    assert outcome.events == []


# --- gaps, thresholds per series, impossible values ----------------------------------------------------


def test_a_gap_in_the_data_longer_than_max_gap_restarts_the_for_clock() -> None:
    clock = Clock(spec(for_seconds=600, max_gap=315, no_data=NoDataPolicy.KEEP))
    clock.at(0, data((A, LOW)))  # midnight
    clock.at(15, EMPTY)
    late = clock.at(8 * 3600, data((A, LOW)))  # 8 a.m.: not eight hours of breach
    assert late.events == []
    assert clock.states[KEY_A].breach_since == 8 * 3600
    assert clock.at(8 * 3600 + 300, data((A, LOW))).events == []
    assert kinds(clock.at(8 * 3600 + 600, data((A, LOW))).events) == [State.FIRING]


def test_a_short_gap_keeps_the_for_clock() -> None:
    clock = Clock(spec(for_seconds=60, max_gap=315, no_data=NoDataPolicy.KEEP))
    clock.at(0, data((A, LOW)))
    clock.at(15, EMPTY)
    assert kinds(clock.at(60, data((A, LOW))).events) == [State.FIRING]


def test_a_threshold_per_series_and_an_error_for_a_series_it_cannot_be_found_for() -> None:
    def per_model(labels: Mapping[str, str]) -> float | str:
        return 0.3 if labels["instance"] == "a:8000" else "the baseline has no entry for model 'x'"

    clock = Clock(spec())
    outcome = clock.at(0, data((A, 0.2), (B, 0.2)), per_model)
    assert outcome.verdicts == {KEY_A: Verdict.BREACH, KEY_B: Verdict.ERROR}
    assert clock.state(KEY_B) is State.INACTIVE
    assert clock.states[KEY_B].error == "the baseline has no entry for model 'x'"
    assert clock.states[KEY_A].threshold == 0.3
    assert outcome.error is None


def test_an_impossible_value_is_an_error_for_its_series_never_a_breach() -> None:
    clock = Clock(spec())
    clock.at(0, data((A, HIGH)))
    bad = SourceResult(invalid=(Invalid(A, "acceptance_rate = -131 is impossible"),))
    outcome = clock.at(15, bad)
    assert outcome.verdicts == {KEY_A: Verdict.ERROR}
    assert (outcome.events, clock.state(KEY_A)) == ([], State.INACTIVE)
    assert clock.states[KEY_A].error == "acceptance_rate = -131 is impossible"


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "threshold", "message"),
    [
        (SourceResult.failed("connection refused"), THRESHOLD, "connection refused"),
        (data((A, HIGH)), "no baseline file is configured", "no baseline file is configured"),
    ],
    ids=["source-failed", "threshold-unknown"],
)
def test_an_error_never_changes_states_and_marks_every_known_series_error(
    result: SourceResult, threshold: float | str, message: str
) -> None:
    clock = Clock(spec(for_seconds=60))
    clock.at(0, data((A, LOW), (B, HIGH)))
    before = clock.states
    outcome = clock.at(30, result, threshold)
    assert outcome.error == message
    assert outcome.events == []
    assert outcome.verdicts == {KEY_A: Verdict.ERROR, KEY_B: Verdict.ERROR}
    for key in (KEY_A, KEY_B):
        old, new = before[key], outcome.states[key]
        assert (new.state, new.since, new.breach_since, new.consecutive, new.last_breach) == (
            old.state,
            old.since,
            old.breach_since,
            old.consecutive,
            old.last_breach,
        )
        assert new.verdict is Verdict.ERROR
        assert new.error == message
        assert new.last_eval == 30


def test_an_error_does_not_resolve_a_firing_series_nor_advance_a_pending_one() -> None:
    clock = Clock(spec(for_seconds=60))
    clock.at(0, data((A, LOW)))
    clock.at(100, SourceResult.failed("timeout"))
    assert clock.state() is State.PENDING
    clock = Clock(spec())
    clock.at(0, data((A, LOW)))
    clock.at(15, SourceResult.failed("timeout"))
    assert clock.state() is State.FIRING
    assert kinds(clock.events) == [State.PENDING, State.FIRING]


def test_an_error_with_no_known_series_even_with_no_data_breach_creates_nothing() -> None:
    outcome = Clock(spec(no_data=NoDataPolicy.BREACH)).at(0, SourceResult.failed("dns"))
    assert (outcome.states, outcome.events, outcome.verdicts) == ({}, [], {})
    assert outcome.error == "dns"


def test_a_source_error_wins_over_a_threshold_error() -> None:
    outcome = Clock(spec()).at(0, SourceResult.failed("query failed"), "no baseline")
    assert outcome.error == "query failed"


def test_the_error_is_cleared_by_the_next_good_evaluation() -> None:
    clock = Clock(spec(for_seconds=60))
    clock.at(0, data((A, LOW)))
    clock.at(15, SourceResult.failed("timeout"))
    outcome = clock.at(30, data((A, LOW)))
    assert outcome.error is None
    assert clock.states[KEY_A].error is None
    assert clock.states[KEY_A].verdict is Verdict.BREACH


# --- several series -------------------------------------------------------------------------------


def test_series_are_independent_one_fires_while_another_stays_ok() -> None:
    clock = Clock(spec(for_seconds=30))
    clock.at(0, data((A, LOW), (B, HIGH)))
    clock.at(15, data((A, LOW), (B, HIGH)))
    outcome = clock.at(30, data((A, LOW), (B, HIGH)))
    assert outcome.verdicts == {KEY_A: Verdict.BREACH, KEY_B: Verdict.OK}
    assert clock.state(KEY_A) is State.FIRING
    assert clock.state(KEY_B) is State.INACTIVE
    assert {e.series for e in clock.events} == {KEY_A}
    assert [dict(e.labels) for e in outcome.events] == [A]


def test_series_timers_are_independent() -> None:
    clock = Clock(spec(for_seconds=30))
    clock.at(0, data((A, LOW), (B, HIGH)))
    clock.at(20, data((A, LOW), (B, LOW)))
    outcome = clock.at(30, data((A, LOW), (B, LOW)))
    assert [(e.kind, e.series) for e in outcome.events] == [(State.FIRING, KEY_A)]
    assert clock.state(KEY_B) is State.PENDING
    outcome = clock.at(50, data((A, HIGH), (B, LOW)))
    assert sorted((e.kind, e.series) for e in outcome.events) == sorted(
        [(State.RESOLVED, KEY_A), (State.FIRING, KEY_B)]
    )


def test_series_key_is_independent_of_label_order() -> None:
    assert series_key({"b": "2", "a": "1"}) == series_key({"a": "1", "b": "2"})
    assert series_key({"a": "1"}) != series_key({"a": "2"})
    assert series_key({}) != series_key({"a": ""})


def test_a_nan_value_is_no_data_for_that_series() -> None:
    result = SourceResult.of([(A, float("nan")), (B, float("inf")), ({"x": "1"}, 0.1)])
    assert result.series == (Series({"x": "1"}, 0.1),)


def test_values_outside_a_signals_domain_are_invalid_and_a_quantiles_nan_is_no_data() -> None:
    rate = SourceResult.checked(get_signal("acceptance_rate"), [(A, -131.0), (B, 1.5), ({"x": "1"}, 0.4)])
    assert rate.series == (Series({"x": "1"}, 0.4),)
    assert [(dict(i.labels), i.reason.split(" is ")[0]) for i in rate.invalid] == [
        (A, "acceptance_rate = -131"),
        (B, "acceptance_rate = 1.5"),
    ]
    running = SourceResult.checked(get_signal("running_requests"), [(A, -5.0), (B, float("inf"))])
    assert [i.reason for i in running.invalid] == [
        "running_requests = -5 is impossible (must be >= 0): check the target's /metrics",
        "running_requests is inf (not a number vLLM can give)",
    ]
    quantile = SourceResult.checked(get_signal("e2e_latency_p95"), [(A, float("nan"))])
    assert quantile == SourceResult()  # no observations in the window


def test_the_missing_series_is_never_forgotten_while_the_signal_stays_missing() -> None:
    clock = Clock(spec(no_data=NoDataPolicy.BREACH, forget_after=60))
    clock.at(0, EMPTY)
    outcome = clock.at(600, EMPTY)
    assert outcome.forgotten == [] and clock.state(MISSING_SERIES) is State.FIRING
    assert kinds(clock.events) == [State.PENDING, State.FIRING]  # paged once, not again and again


def test_a_series_restored_without_a_last_seen_time_still_ages() -> None:
    restored = SeriesState(labels=A, state=State.FIRING, since=0, last_eval=10)
    clock = Clock(spec(forget_after=100), {KEY_A: restored})
    assert clock.at(50, EMPTY).forgotten == []
    assert clock.at(111, EMPTY).forgotten == [KEY_A]
