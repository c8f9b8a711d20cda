"""The scrape source computes catalog signals from vLLM /metrics samples the way PromQL would."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specguard.rules.signals import DEFAULT_GROUP_BY, get_signal
from specguard.sources.base import SourceResult
from specguard.sources.scrape import ScrapeSource
from specguard.sources.targets import instance_label
from specguard.sources.windows import counter_rate, signal_over
from specguard.store.exposition import parse_exposition
from tests.pages import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    E2E,
    GENERATED,
    INSTANCE,
    ITL,
    KV_CACHE,
    MODEL,
    PER_POS,
    REJECTING,
    RUNNING,
    SELF_DRAFT,
    TARGET,
    WAITING,
    Clock,
    add,
    add_many,
    add_per_position,
    observe,
    set_value,
    with_engine_one,
)

# --- querying ------------------------------------------------------------------------------------


def make_source(clock: Clock, targets: Sequence[str] = (TARGET,), **kwargs: Any) -> ScrapeSource:
    kwargs.setdefault("timeout", 2.0)
    kwargs.setdefault("retention", 600.0)
    return ScrapeSource(targets, clock=clock, **kwargs)


async def query(
    source: ScrapeSource,
    signal: str,
    window: float = 60.0,
    group_by: Sequence[str] = DEFAULT_GROUP_BY,
) -> dict[tuple[tuple[str, str], ...], float]:
    result = await source.query_signal(get_signal(signal), window, group_by)
    assert result.error is None
    return {tuple(sorted(s.labels.items())): s.value for s in result.series}


def key(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


SERIES = key(instance=INSTANCE, model_name=MODEL)


def by_position(values: dict[tuple[tuple[str, str], ...], float]) -> dict[str, float]:
    return {dict(labels)["position"]: value for labels, value in values.items()}


def ingest_pair(source: ScrapeSource, first: str, second: str, clock: Clock, dt: float) -> None:
    source.ingest(TARGET, first, clock.now)
    clock.now += dt
    source.ingest(TARGET, second, clock.now)


# --- speculative-decoding ratios ---------------------------------------------------------------


async def test_acceptance_signals_equal_what_the_counter_deltas_imply() -> None:
    clock = Clock()
    source = make_source(clock)
    # 10 drafts of 5 tokens, 30 accepted: positions 0..4 accepted in 9, 8, 6, 4, 3 drafts.
    later = add_many(SELF_DRAFT, {ACCEPTED: 30, DRAFT_TOKENS: 50, DRAFTS: 10})
    later = add_per_position(later, [9, 8, 6, 4, 3])
    ingest_pair(source, SELF_DRAFT, later, clock, dt=15.0)

    acceptance = await query(source, "acceptance_rate")
    length = await query(source, "mean_acceptance_length")
    positions = await query(source, "acceptance_by_position")

    assert acceptance == {SERIES: pytest.approx(float(Fraction(30, 50)), rel=1e-12)}
    assert length == {SERIES: pytest.approx(float(1 + Fraction(30, 10)), rel=1e-12)}
    assert set(positions) == {(*SERIES, ("position", str(i))) for i in range(5)}
    assert by_position(positions) == {
        str(i): pytest.approx(float(Fraction(n, 10)), rel=1e-12) for i, n in enumerate([9, 8, 6, 4, 3])
    }


async def test_a_rejecting_draft_shows_low_acceptance_per_position() -> None:
    clock = Clock()
    source = make_source(clock)
    # 4-token drafts (the rejecting fixture has positions 0..3): 20 drafts, 3 tokens accepted.
    later = add_many(REJECTING, {ACCEPTED: 3, DRAFT_TOKENS: 80, DRAFTS: 20})
    later = add_per_position(later, [2, 1, 0, 0])
    ingest_pair(source, REJECTING, later, clock, dt=30.0)

    assert await query(source, "acceptance_rate") == {SERIES: pytest.approx(3 / 80, rel=1e-12)}
    assert by_position(await query(source, "acceptance_by_position")) == {
        "0": pytest.approx(0.1, rel=1e-12),
        "1": pytest.approx(0.05, rel=1e-12),
        "2": 0.0,
        "3": 0.0,
    }


async def test_a_counter_reset_counts_the_values_after_the_restart() -> None:
    clock = Clock()
    source = make_source(clock)
    # vLLM restarted between the scrapes: every counter starts again from 0.
    restarted = SELF_DRAFT
    for name, value in {ACCEPTED: 12, DRAFT_TOKENS: 20, DRAFTS: 4}.items():
        restarted = set_value(restarted, name, value)
    for position, value in enumerate([4, 3, 2, 2, 1]):
        restarted = set_value(restarted, PER_POS, value, position=str(position))
    ingest_pair(source, SELF_DRAFT, restarted, clock, dt=15.0)

    assert await query(source, "acceptance_rate") == {SERIES: pytest.approx(12 / 20, rel=1e-12)}
    assert await query(source, "mean_acceptance_length") == {SERIES: pytest.approx(1 + 12 / 4, rel=1e-12)}
    positions = by_position(await query(source, "acceptance_by_position"))
    assert positions == {
        "0": pytest.approx(1.0, rel=1e-12),
        "1": pytest.approx(0.75, rel=1e-12),
        "2": pytest.approx(0.5, rel=1e-12),
        "3": pytest.approx(0.5, rel=1e-12),
        "4": pytest.approx(0.25, rel=1e-12),
    }
    assert min(positions.values()) >= 0


async def test_a_reset_inside_the_window_adds_the_increases_on_both_sides() -> None:
    clock = Clock()
    source = make_source(clock)
    restarted = set_value(SELF_DRAFT, GENERATED, 50.0)
    restarted = add_many(restarted, {ACCEPTED: -180, DRAFT_TOKENS: -1205, DRAFTS: -241})
    later = add(restarted, GENERATED, 30.0)
    later = add_many(later, {ACCEPTED: 6, DRAFT_TOKENS: 10, DRAFTS: 2})
    source.ingest(TARGET, SELF_DRAFT, 1000.0)  # 432 generated tokens; 188/1225/245
    source.ingest(TARGET, restarted, 1010.0)  # restart, then 50 tokens; 8/20/4
    source.ingest(TARGET, later, 1020.0)  # 30 more tokens; 14/30/6
    clock.now = 1020.0

    throughput = await query(source, "generation_throughput")
    acceptance = await query(source, "acceptance_rate")

    assert throughput == {SERIES: pytest.approx((50 + 30) / 20, rel=1e-12)}
    assert acceptance == {SERIES: pytest.approx(14 / 30, rel=1e-12)}


def test_counter_rate_treats_a_decrease_as_a_restart_from_zero() -> None:
    assert counter_rate([(0.0, 100.0), (10.0, 5.0)]) == pytest.approx(0.5)
    assert counter_rate([(0.0, 100.0), (10.0, 110.0), (20.0, 3.0), (30.0, 9.0)]) == pytest.approx(
        (10 + 3 + 6) / 30
    )


# --- windows and missing data --------------------------------------------------------------------


async def test_one_sample_is_warming_up_and_two_too_far_apart_for_the_window_are_no_data() -> None:
    clock = Clock()
    source = make_source(clock)
    before = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)
    source.ingest(TARGET, SELF_DRAFT, clock.now)

    one = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)
    clock.now += 100
    source.ingest(TARGET, add(SELF_DRAFT, DRAFT_TOKENS, 5), clock.now)
    first_left_the_window = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)

    assert before == one == SourceResult(warming=frozenset({INSTANCE}))  # no rate can exist yet
    assert first_left_the_window == SourceResult()  # the target can answer; the window has no rate
    assert await query(source, "acceptance_rate", window=120.0) == {SERIES: 0.0}


async def test_no_drafts_in_the_window_is_no_data_not_zero() -> None:
    clock = Clock()
    source = make_source(clock)
    ingest_pair(source, SELF_DRAFT, SELF_DRAFT, clock, dt=15.0)

    for signal in ("acceptance_rate", "mean_acceptance_length", "acceptance_by_position"):
        assert await query(source, signal) == {}, signal
    # A counter that did not move is a rate of 0, which is data.
    assert await query(source, "preemption_rate") == {SERIES: 0.0}


async def test_samples_older_than_retention_are_dropped() -> None:
    clock = Clock()
    source = make_source(clock, retention=30.0)
    middle = add_many(SELF_DRAFT, {ACCEPTED: 100, DRAFT_TOKENS: 100})
    last = add_many(middle, {ACCEPTED: 1, DRAFT_TOKENS: 4})
    source.ingest(TARGET, SELF_DRAFT, 1000.0)
    source.ingest(TARGET, middle, 1020.0)
    source.ingest(TARGET, last, 1040.0)  # 1000 is now older than 30 s
    clock.now = 1040.0

    assert await query(source, "acceptance_rate", window=600.0) == {SERIES: pytest.approx(0.25)}


async def test_a_clock_stepped_back_drops_the_samples_from_the_future() -> None:
    clock = Clock(now=1005.0)
    source = make_source(clock)
    source.ingest(TARGET, SELF_DRAFT, 1000.0)
    source.ingest(TARGET, add_many(SELF_DRAFT, {ACCEPTED: 9, DRAFT_TOKENS: 10}), 1010.0)
    source.ingest(TARGET, add_many(SELF_DRAFT, {ACCEPTED: 1, DRAFT_TOKENS: 4}), 1005.0)
    clock.now = 1100.0  # even once 1010 is in the past again, it is gone

    assert await query(source, "acceptance_rate", window=200.0) == {SERIES: pytest.approx(0.25)}


async def test_samples_after_now_are_not_used() -> None:
    clock = Clock(now=1010.0)
    source = make_source(clock)
    source.ingest(TARGET, SELF_DRAFT, 1000.0)
    source.ingest(TARGET, add_many(SELF_DRAFT, {ACCEPTED: 1, DRAFT_TOKENS: 2}), 1010.0)
    source.ingest(TARGET, add_many(SELF_DRAFT, {ACCEPTED: 2, DRAFT_TOKENS: 100}), 1020.0)

    assert await query(source, "acceptance_rate") == {SERIES: pytest.approx(0.5)}


# --- grouping ------------------------------------------------------------------------------------


async def test_engines_are_summed_unless_grouped_by_engine() -> None:
    clock = Clock()
    source = make_source(clock)
    first = with_engine_one(SELF_DRAFT)
    later = add_many(first, {ACCEPTED: 30, DRAFT_TOKENS: 50}, engine="0")
    later = add_many(later, {ACCEPTED: 10, DRAFT_TOKENS: 50}, engine="1")
    ingest_pair(source, first, later, clock, dt=10.0)

    summed = await query(source, "acceptance_rate")
    per_engine = await query(source, "acceptance_rate", group_by=[*DEFAULT_GROUP_BY, "engine"])
    everything = await query(source, "acceptance_rate", group_by=[])

    assert summed == {SERIES: pytest.approx(40 / 100, rel=1e-12)}
    assert per_engine == {
        key(engine="0", instance=INSTANCE, model_name=MODEL): pytest.approx(0.6, rel=1e-12),
        key(engine="1", instance=INSTANCE, model_name=MODEL): pytest.approx(0.2, rel=1e-12),
    }
    assert everything == {(): pytest.approx(0.4, rel=1e-12)}


async def test_each_target_is_its_own_instance() -> None:
    clock = Clock()
    first, second = "http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"
    source = make_source(clock, targets=[first, second])
    for target, accepted in ((first, 10), (second, 30)):
        source.ingest(target, SELF_DRAFT, 1000.0)
        source.ingest(target, add_many(SELF_DRAFT, {ACCEPTED: accepted, DRAFT_TOKENS: 40}), 1015.0)
    clock.now = 1015.0

    per_instance = await query(source, "acceptance_rate")
    per_model = await query(source, "acceptance_rate", group_by=["model_name"])

    assert per_instance == {
        key(instance="10.0.0.1:8000", model_name=MODEL): pytest.approx(0.25),
        key(instance="10.0.0.2:8000", model_name=MODEL): pytest.approx(0.75),
    }
    assert per_model == {key(model_name=MODEL): pytest.approx(0.5)}


def test_instance_is_host_and_port_of_the_target() -> None:
    assert instance_label("http://127.0.0.1:8000/metrics") == "127.0.0.1:8000"
    assert instance_label("https://user:secret@vllm.internal:8443/metrics") == "vllm.internal:8443"
    assert instance_label("http://[::1]:8000/metrics") == "[::1]:8000"
    assert instance_label("replay") == "replay"


# --- gauges --------------------------------------------------------------------------------------


async def test_kv_cache_usage_is_averaged_over_the_window() -> None:
    clock = Clock()
    source = make_source(clock)
    for ts, usage in ((1000.0, 0.2), (1010.0, 0.4), (1020.0, 0.9)):
        source.ingest(TARGET, set_value(SELF_DRAFT, KV_CACHE, usage), ts)
    clock.now = 1020.0

    assert await query(source, "kv_cache_usage", window=60.0) == {
        SERIES: pytest.approx((0.2 + 0.4 + 0.9) / 3)
    }
    assert await query(source, "kv_cache_usage", window=15.0) == {SERIES: pytest.approx((0.4 + 0.9) / 2)}
    # avg_over_time needs a single sample, unlike rate.
    assert await query(source, "kv_cache_usage", window=5.0) == {SERIES: pytest.approx(0.9)}


async def test_the_fullest_engine_is_the_kv_usage_and_queues_add_up() -> None:
    clock = Clock()
    source = make_source(clock)
    text = set_value(with_engine_one(SELF_DRAFT), KV_CACHE, 0.99, engine="1")
    text = set_value(text, KV_CACHE, 0.10, engine="0")
    text = set_value(set_value(text, WAITING, 7, engine="0"), WAITING, 3, engine="1")
    text = set_value(set_value(text, RUNNING, 2, engine="0"), RUNNING, 5, engine="1")
    source.ingest(TARGET, text, clock.now)

    assert await query(source, "kv_cache_usage") == {SERIES: pytest.approx(0.99)}  # not the mean, 0.545
    assert await query(source, "waiting_requests") == {SERIES: 10.0}
    assert await query(source, "running_requests") == {SERIES: 7.0}
    per_engine = await query(source, "kv_cache_usage", group_by=("instance", "engine"))
    assert per_engine == {
        (("engine", "0"), ("instance", INSTANCE)): pytest.approx(0.10),
        (("engine", "1"), ("instance", INSTANCE)): pytest.approx(0.99),
    }


async def test_kv_cache_usage_falls_back_to_the_pre_0_12_name() -> None:
    clock = Clock()
    source = make_source(clock)
    old = set_value(SELF_DRAFT, KV_CACHE, 0.35).replace(KV_CACHE, "vllm:gpu_cache_usage_perc")
    assert KV_CACHE not in old
    source.ingest(TARGET, old, clock.now)

    assert await query(source, "kv_cache_usage") == {SERIES: pytest.approx(0.35)}


async def test_the_newest_name_wins_when_both_are_exposed() -> None:
    clock = Clock()
    source = make_source(clock)
    both = set_value(SELF_DRAFT, KV_CACHE, 0.3) + (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.7\n'
    )
    source.ingest(TARGET, both, clock.now)

    assert await query(source, "kv_cache_usage") == {SERIES: pytest.approx(0.3)}


# --- histogram quantiles -------------------------------------------------------------------------


async def test_e2e_latency_quantiles_follow_prometheus_interpolation() -> None:
    clock = Clock()
    source = make_source(clock)
    # Buckets 0.3, 0.5, 0.8, 1.0...: 3 new observations <= 0.3, 1 in (0.3, 0.5], 4 in (0.5, 0.8],
    # 2 in (0.8, 1.0]; cumulative 3, 4, 8, 10.
    observed = [0.1, 0.2, 0.25, 0.4, 0.6, 0.7, 0.75, 0.78, 0.9, 0.95]
    ingest_pair(source, SELF_DRAFT, observe(SELF_DRAFT, E2E, observed), clock, dt=10.0)

    p50 = await query(source, "e2e_latency_p50")
    p95 = await query(source, "e2e_latency_p95")
    p99 = await query(source, "e2e_latency_p99")

    # rank 5 lies in (0.5, 0.8], which holds ranks 4..8: 0.5 + 0.3 * (5 - 4) / 4
    assert p50 == {SERIES: pytest.approx(0.5 + 0.3 * 1 / 4, rel=1e-12)}
    # rank 9.5 lies in (0.8, 1.0], which holds ranks 8..10: 0.8 + 0.2 * 1.5 / 2
    assert p95 == {SERIES: pytest.approx(0.8 + 0.2 * 1.5 / 2, rel=1e-12)}
    assert p99 == {SERIES: pytest.approx(0.8 + 0.2 * 1.9 / 2, rel=1e-12)}


async def test_the_mean_latency_is_exact_where_the_quantile_reads_the_bucket() -> None:
    clock = Clock()
    source = make_source(clock)
    # Every request between 0.55 and 0.6 s: inside vLLM's 0.5-0.8 s bucket, where p95 interpolates
    # to near the top while the histogram's sum / count gives the true mean.
    observed = [0.55, 0.56, 0.57, 0.58, 0.6]
    ingest_pair(source, SELF_DRAFT, observe(SELF_DRAFT, E2E, observed), clock, dt=10.0)

    assert await query(source, "e2e_latency_mean") == {SERIES: pytest.approx(0.572, rel=1e-9)}
    assert await query(source, "e2e_latency_p95") == {SERIES: pytest.approx(0.5 + 0.3 * 0.95, rel=1e-12)}


async def test_tpot_reads_vllms_per_request_histogram() -> None:
    clock = Clock()
    source = make_source(clock)
    tpot = "vllm:request_time_per_output_token_seconds"
    ingest_pair(source, SELF_DRAFT, observe(SELF_DRAFT, tpot, [0.012, 0.014, 0.02, 0.03]), clock, dt=10.0)

    # ranks 1..3 in (0.01, 0.025]: p50 at rank 2 is 0.01 + 0.015 * 2 / 3
    assert await query(source, "tpot_p50") == {SERIES: pytest.approx(0.01 + 0.015 * 2 / 3, rel=1e-12)}
    assert await query(source, "tpot_mean") == {SERIES: pytest.approx(0.019, rel=1e-9)}


async def test_samples_taken_elsewhere_give_what_the_rule_computes_over_them() -> None:
    clock = Clock()
    source = make_source(clock)
    later = observe(add(SELF_DRAFT, GENERATED, 500), E2E, [0.4, 0.6, 0.7, 0.9])
    ingest_pair(source, SELF_DRAFT, later, clock, dt=10.0)
    samples = {
        INSTANCE: [(clock.now - 10.0, parse_exposition(SELF_DRAFT)), (clock.now, parse_exposition(later))]
    }
    for name in ("e2e_latency_p95", "e2e_latency_mean", "generation_throughput"):
        theirs = signal_over(get_signal(name), samples, DEFAULT_GROUP_BY)
        assert {key(**s.labels): s.value for s in theirs.series} == await query(source, name), name
    with pytest.raises(ValueError, match="token_acceptance needs the scrape source's edge samples"):
        signal_over(get_signal("token_acceptance"), samples, DEFAULT_GROUP_BY)


async def test_itl_quantile_in_the_first_bucket_interpolates_from_zero() -> None:
    clock = Clock()
    source = make_source(clock)
    observed = [0.002, 0.004, 0.006, 0.008]  # all <= 0.01, the first ITL bucket
    ingest_pair(source, SELF_DRAFT, observe(SELF_DRAFT, ITL, observed), clock, dt=10.0)

    assert await query(source, "itl_p50") == {SERIES: pytest.approx(0.01 * 2 / 4, rel=1e-12)}
    assert await query(source, "itl_p95") == {SERIES: pytest.approx(0.01 * 3.8 / 4, rel=1e-12)}


async def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    clock = Clock()
    source = make_source(clock)
    ingest_pair(source, SELF_DRAFT, observe(SELF_DRAFT, ITL, [100.0, 200.0]), clock, dt=10.0)

    assert await query(source, "itl_p50") == {SERIES: 80.0}


async def test_no_observations_in_the_window_is_no_quantile() -> None:
    clock = Clock()
    source = make_source(clock)
    ingest_pair(source, SELF_DRAFT, SELF_DRAFT, clock, dt=10.0)

    assert await query(source, "e2e_latency_p95") == {}


async def test_itl_falls_back_to_time_per_output_token() -> None:
    clock = Clock()
    source = make_source(clock)
    old_name = "vllm:time_per_output_token_seconds"
    old = SELF_DRAFT.replace(ITL, old_name)
    ingest_pair(source, old, observe(old, old_name, [0.02, 0.02, 0.02, 0.02]), clock, dt=10.0)

    # all in (0.01, 0.025]: rank 2 of 4 -> 0.01 + 0.015 * 2 / 4
    assert await query(source, "itl_p50") == {SERIES: pytest.approx(0.0175, rel=1e-12)}


async def test_quantiles_of_two_engines_merge_their_buckets() -> None:
    clock = Clock()
    source = make_source(clock)
    first = with_engine_one(SELF_DRAFT)
    later = observe(first, E2E, [0.1, 0.1], engine="0")
    later = observe(later, E2E, [0.9, 0.9], engine="1")
    ingest_pair(source, first, later, clock, dt=10.0)

    merged = await query(source, "e2e_latency_p50")
    split = await query(source, "e2e_latency_p50", group_by=["engine"])

    # merged cumulative: 2 <= 0.3, 4 <= 1.0; rank 2 -> 0.3 * 2 / 2
    assert merged == {SERIES: pytest.approx(0.3, rel=1e-12)}
    assert split == {
        key(engine="0"): pytest.approx(0.15, rel=1e-12),
        key(engine="1"): pytest.approx(0.9, rel=1e-12),
    }


# --- the rest of the Source interface ------------------------------------------------------------


async def test_raw_promql_is_an_error_naming_the_prometheus_source() -> None:
    source = make_source(Clock())
    result = await source.query_expr("up")
    assert result.series == ()
    assert result.error is not None and "prometheus source" in result.error


async def test_ingesting_malformed_text_records_an_error_and_keeps_the_ring() -> None:
    clock = Clock()
    source = make_source(clock)
    source.ingest(TARGET, SELF_DRAFT, 1000.0)
    source.ingest(TARGET, "<html>oops</html>", 1005.0)
    assert "not valid Prometheus text exposition" in source.last_errors[TARGET]

    clock.now = 1010.0
    source.ingest(TARGET, add_many(SELF_DRAFT, {ACCEPTED: 1, DRAFT_TOKENS: 4}), 1010.0)
    assert source.last_errors == {}
    assert await query(source, "acceptance_rate") == {SERIES: pytest.approx(0.25)}


# --- over HTTP -----------------------------------------------------------------------------------


class Vllm:
    """A fake vLLM /metrics endpoint serving a queue of responses, then the last one forever."""

    def __init__(self, *responses: tuple[int, str]) -> None:
        self.responses = list(responses)
        self.requests = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        status, body = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        return web.Response(status=status, text=body, content_type="text/plain")


async def serve(aiohttp_server: Any, **routes: Any) -> str:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(f"/{path}", handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


def refused_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


LATER = add_per_position(add_many(SELF_DRAFT, {ACCEPTED: 30, DRAFT_TOKENS: 50, DRAFTS: 10}), [9, 8, 6, 4, 3])


async def test_refresh_scrapes_a_real_server_and_computes_signals(aiohttp_server: Any) -> None:
    vllm = Vllm((200, SELF_DRAFT), (200, LATER))
    base = await serve(aiohttp_server, metrics=vllm.handle)
    clock = Clock()
    source = make_source(clock, targets=[f"{base}/metrics"])
    try:
        await source.refresh()
        clock.now += 15.0
        await source.refresh()

        instance = base.removeprefix("http://")
        series = key(instance=instance, model_name=MODEL)
        assert vllm.requests == 2
        assert source.last_errors == {}
        assert await query(source, "acceptance_rate") == {series: pytest.approx(0.6, rel=1e-12)}
        assert await query(source, "mean_acceptance_length") == {series: pytest.approx(4.0, rel=1e-12)}
    finally:
        await source.close()


async def test_a_refused_connection_is_no_data_and_a_recorded_error(aiohttp_server: Any) -> None:
    vllm = Vllm((200, SELF_DRAFT), (200, LATER))
    good = f"{await serve(aiohttp_server, metrics=vllm.handle)}/metrics"
    down = refused_url()
    clock = Clock()
    source = make_source(clock, targets=[down, good])
    try:
        await source.refresh()
        clock.now += 15.0
        await source.refresh()

        result = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)
        assert result.error is None
        assert [dict(s.labels)["instance"] for s in result.series] == [instance_label(good)]
        assert set(source.last_errors) == {down}
        assert "Connect" in source.last_errors[down]
        assert down in result.detail["scrape_errors"]
    finally:
        await source.close()


async def test_only_a_refused_target_means_no_data(aiohttp_server: Any) -> None:
    down = refused_url()
    source = make_source(Clock(), targets=[down])
    try:
        await source.refresh()
        await source.refresh()
        result = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)
        assert result.series == () and result.error is None
        assert down in source.last_errors
    finally:
        await source.close()


async def test_http_errors_and_garbage_are_recorded_per_target(aiohttp_server: Any) -> None:
    broken = Vllm((500, "engine dead"))
    garbage = Vllm((200, "<html><body>login</body></html>"))
    base = await serve(aiohttp_server, broken=broken.handle, garbage=garbage.handle)
    source = make_source(
        Clock(), targets=[f"{base}/broken", f"{base}/garbage"], names={f"{base}/garbage": "garbage"}
    )
    try:
        await source.refresh()
        assert source.last_errors[f"{base}/broken"] == "HTTP 500 Internal Server Error"
        assert source.last_errors[f"{base}/garbage"].startswith("not valid Prometheus text exposition")
    finally:
        await source.close()


async def test_an_error_is_cleared_by_the_next_good_scrape(aiohttp_server: Any) -> None:
    flaky = Vllm((503, "starting"), (200, SELF_DRAFT))
    target = f"{await serve(aiohttp_server, metrics=flaky.handle)}/metrics"
    source = make_source(Clock(), targets=[target])
    try:
        await source.refresh()
        assert source.last_errors[target].startswith("HTTP 503")
        await source.refresh()
        assert source.last_errors == {}
    finally:
        await source.close()


async def test_a_slow_target_times_out(aiohttp_server: Any) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text=SELF_DRAFT)

    target = f"{await serve(aiohttp_server, metrics=hang)}/metrics"
    source = make_source(Clock(), targets=[target], timeout=0.2)
    try:
        await asyncio.wait_for(source.refresh(), timeout=5.0)
        assert source.last_errors == {target: "no page within 0.2s (reading and parsing)"}
    finally:
        release.set()
        await source.close()


async def test_a_session_passed_in_is_left_open(aiohttp_server: Any) -> None:
    target = f"{await serve(aiohttp_server, metrics=Vllm((200, SELF_DRAFT)).handle)}/metrics"
    async with aiohttp.ClientSession() as session:
        source = make_source(Clock(), targets=[target], session=session)
        await source.refresh()
        await source.close()
        assert not session.closed
        assert source.last_errors == {}
