"""The backtest's history source against the timeline's own ground truth: each signal over a window
of whole minutes, summed over a group's servers, as the catalog computes it; and what history
cannot answer said as an error, never a guess."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import pytest

from specguard.rules.matchers import parse_matchers
from specguard.rules.signals import get_signal
from specguard.sources.base import SourceResult
from specguard.sources.history import HistorySource, load
from specguard.store.connection import read_only
from tests import week
from tests.backtest_week import record_history
from tests.week import Conditions, Minute, Server

T0 = 1_796_000_040.0 - 1_796_000_040.0 % 3600  # on the hour
MINUTES = 30


def steady(alpha: float, kv: float) -> Callable[[float], Conditions]:
    return lambda t: Conditions(alpha=alpha, load=1.0, kv=kv, preemptions=1 if t >= T0 + 20 * 60 else 0)


Recorded = tuple[HistorySource, list[Server], list[float]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    directory = tmp_path_factory.mktemp("history")
    servers = [Server("a:8000", "m", 5, steady(0.8, 0.4)), Server("b:8000", "m", 3, steady(0.6, 0.9))]
    record_history(directory / "specguard.db", servers, T0, MINUTES)
    with contextlib.closing(read_only(directory / "specguard.db")) as db:
        recordings, count = load(db, T0, T0 + MINUTES * 60)
    now = [T0]
    return HistorySource(recordings, T0, count, lambda: now[0]), servers, now


def ask(
    recorded: Recorded,
    signal: str,
    window: float,
    at: float,
    group_by: Sequence[str] = ("instance", "model_name"),
    match: dict[str, str] | None = None,
) -> SourceResult:
    source, _, now = recorded
    now[0] = at
    matchers = parse_matchers(match or {})
    return asyncio.run(source.query_signal(get_signal(signal), window, group_by, matchers))


def values(result: SourceResult) -> dict[str, float]:
    assert result.error is None, result.error
    return {s.labels.get("instance", "*") + s.labels.get("position", ""): s.value for s in result.series}


def minutes_of(server: Server, first: float, last: float) -> list[Minute]:
    return [m for m in server.truth if first <= m.at < last]


def test_a_window_reads_the_whole_minutes_that_end_by_the_moment_asked(recorded: Recorded) -> None:
    _, (a, b), _ = recorded
    at = T0 + 10 * 60 + 45  # 45 s into the eleventh minute: that minute is not over yet
    got = values(ask(recorded, "acceptance_rate", 300, at))
    for server in (a, b):
        minutes = minutes_of(server, T0 + 5 * 60, T0 + 10 * 60)
        assert len(minutes) == 5
        truth = sum(m.accepted for m in minutes) / sum(m.draft_tokens for m in minutes)
        assert got[server.instance] == pytest.approx(truth, rel=1e-12)
    # 30 s reads the last whole minute; 90 s the two that cover it.
    last = minutes_of(a, T0 + 9 * 60, T0 + 10 * 60)[0]
    assert values(ask(recorded, "acceptance_rate", 30, at))["a:8000"] == pytest.approx(
        last.accepted / last.draft_tokens
    )
    two = minutes_of(a, T0 + 8 * 60, T0 + 10 * 60)
    expected = sum(m.accepted for m in two) / sum(m.draft_tokens for m in two)
    assert values(ask(recorded, "acceptance_rate", 90, at))["a:8000"] == pytest.approx(expected)


def test_a_group_sums_its_servers_and_the_chain_model_counts_trials_as_vllm_does(recorded: Recorded) -> None:
    _, (a, b), _ = recorded
    at = T0 + 20 * 60
    both = [*minutes_of(a, T0 + 15 * 60, at), *minutes_of(b, T0 + 15 * 60, at)]
    got = values(ask(recorded, "acceptance_rate", 300, at, group_by=("model_name",)))
    assert got == {"*": pytest.approx(sum(m.accepted for m in both) / sum(m.draft_tokens for m in both))}
    result = ask(recorded, "token_acceptance", 300, at)
    for server in (a, b):
        minutes = minutes_of(server, T0 + 15 * 60, at)
        successes = sum(m.accepted for m in minutes)
        whole = sum(m.positions[-1] for m in minutes)  # drafts accepted to their last position
        trials = successes + sum(m.drafts for m in minutes) - whole
        (series,) = [s for s in result.series if s.labels["instance"] == server.instance]
        assert series.value == pytest.approx(successes / trials) and series.trials == pytest.approx(trials)
    by_position = values(ask(recorded, "acceptance_by_position", 300, at, match={"instance": "b:8000"}))
    minutes = minutes_of(b, T0 + 15 * 60, at)
    drafts = sum(m.drafts for m in minutes)
    assert by_position == {
        f"b:8000{i}": pytest.approx(sum(m.positions[i] for m in minutes) / drafts) for i in range(3)
    }
    assert values(ask(recorded, "num_speculative_tokens", 300, at)) == {"a:8000": 5.0, "b:8000": 3.0}


def test_latency_quantiles_gauges_and_rates_are_the_truths(recorded: Recorded) -> None:
    _, (a, _), _ = recorded
    at = T0 + 25 * 60
    minutes = minutes_of(a, T0 + 20 * 60, at)
    p95 = week.quantile(0.95, week.histogram(minutes, "e2e"))
    assert values(ask(recorded, "e2e_latency_p95", 300, at))["a:8000"] == pytest.approx(p95)
    assert values(ask(recorded, "kv_cache_usage", 300, at)) == {
        "a:8000": pytest.approx(0.4),
        "b:8000": pytest.approx(0.9),
    }
    # The fleet's fullest server, averaged over the window (the signal combines by max).
    assert values(ask(recorded, "kv_cache_usage", 300, at, group_by=())) == {"*": pytest.approx(0.9)}
    assert values(ask(recorded, "preemption_rate", 300, at))["a:8000"] == pytest.approx(1 / 60)
    requests = sum(m.requests for m in minutes)
    assert values(ask(recorded, "request_rate", 300, at))["a:8000"] == pytest.approx(requests / 300)


def test_no_data_before_history_begins_or_after_a_server_stops(recorded: Recorded) -> None:
    assert ask(recorded, "acceptance_rate", 60, T0).series == ()  # no whole minute yet
    assert ask(recorded, "acceptance_rate", 60, T0 + (MINUTES + 5) * 60).series == ()  # past the period
    assert ask(recorded, "acceptance_rate", 60, T0 + 60, match={"instance": "c:8000"}).series == ()


@pytest.mark.parametrize(
    ("signal", "group_by", "match", "said"),
    [
        ("tpot_p95", ("instance",), None, "history does not keep vllm:request_time_per_output_token_seconds"),
        ("routed_request_rate", ("pool",), None, "replay it from Prometheus"),
        ("acceptance_rate", ("instance", "engine"), None, "not by engine"),
        ("acceptance_rate", ("instance",), {"finished_reason": "stop"}, "not by finished_reason"),
    ],
)
def test_what_history_does_not_keep_is_an_error_with_the_reason(
    recorded: Recorded, signal: str, group_by: tuple[str, ...], match: dict[str, str] | None, said: str
) -> None:
    result = ask(recorded, signal, 300, T0 + 10 * 60, group_by=group_by, match=match)
    assert result.error is not None and said in result.error and result.series == ()


def test_raw_promql_is_refused_by_history(recorded: Recorded) -> None:
    source, _, _ = recorded
    result = asyncio.run(source.query_expr("up"))
    assert result.error is not None and "replay a rule on PromQL from Prometheus" in result.error
