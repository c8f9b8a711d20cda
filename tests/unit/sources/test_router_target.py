"""The router's /specguard/metrics as one more scrape target: its signals per class and pool, and
nothing but "no data" from it for vLLM's signals."""

from __future__ import annotations

import pytest

from specguard.rules.signals import CATALOG, DEFAULT_GROUP_BY, Kind, get_signal
from specguard.sources.scrape import ScrapeSource
from tests.pages import ACCEPTED, DRAFT_TOKENS, INSTANCE, MODEL, SELF_DRAFT, TARGET, Clock, add_many
from tests.router_pages import RouterCounts

ROUTER = "http://127.0.0.1:8081/specguard/metrics"
ROUTER_INSTANCE = "127.0.0.1:8081"
ROUTER_SIGNALS = {"routed_request_rate", "routed_latency_p50", "routed_latency_p95", "routed_malformed_rate"}


def key(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def both_targets() -> tuple[ScrapeSource, Clock]:
    clock = Clock()
    source = ScrapeSource([TARGET, ROUTER], timeout=2.0, retention=600.0, clock=clock)
    counts = RouterCounts()
    counts.observe("short", "standard", [0.2] * 4)
    counts.observe("default", "speculative", [3.0] * 10)
    counts.malformed["json"] = 1
    source.ingest(TARGET, SELF_DRAFT, 1000.0)
    source.ingest(ROUTER, counts.page(), 1000.0)
    counts.observe("short", "standard", [0.2] * 30)  # 30 in 30 s: 1 per second
    counts.observe("default", "speculative", [3.0] * 15 + [20.0] * 45)  # 2 per second
    counts.malformed["json"] += 6
    source.ingest(TARGET, add_many(SELF_DRAFT, {ACCEPTED: 30, DRAFT_TOKENS: 40}), 1030.0)
    source.ingest(ROUTER, counts.page(), 1030.0)
    clock.now = 1030.0
    return source, clock


async def test_router_signals_come_per_class_and_pool_from_the_router_target_only() -> None:
    source, _ = both_targets()

    async def values(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        result = await source.query_signal(get_signal(name), 60.0, DEFAULT_GROUP_BY)
        assert result.error is None and not result.invalid
        return {key(**s.labels): s.value for s in result.series}

    router = {"instance": ROUTER_INSTANCE}  # no model_name on the router's page: absent, as in PromQL
    short, default = (
        key(**router, **{"class": "short", "pool": "standard"}),
        key(**router, **{"class": "default", "pool": "speculative"}),
    )
    assert await values("routed_request_rate") == {short: pytest.approx(1.0), default: pytest.approx(2.0)}
    # 15 of the default class's 60 took 3 s (bucket 2.5-5), 45 took 20 s (bucket 10-30).
    p50 = await values("routed_latency_p50")
    assert p50[short] == pytest.approx(0.2, abs=0.06)  # inside the 0.1-0.25 bucket
    assert 10.0 < p50[default] <= 30.0
    assert await values("routed_malformed_rate") == {
        key(instance=ROUTER_INSTANCE, reason="json"): pytest.approx(0.2)
    }
    # A rule grouping by class alone adds the pools up.
    rate = await source.query_signal(get_signal("routed_request_rate"), 60.0, ["class"], keep_intrinsic=False)
    assert {key(**s.labels): s.value for s in rate.series} == {
        key(**{"class": "short"}): pytest.approx(1.0),
        key(**{"class": "default"}): pytest.approx(2.0),
    }


@pytest.mark.parametrize(
    "name", sorted(n for n, s in CATALOG.items() if n not in ROUTER_SIGNALS and s.kind is not Kind.SPEEDUP)
)
async def test_a_vllm_signal_has_no_series_and_no_error_from_the_router_target(name: str) -> None:
    source, _ = both_targets()

    result = await source.query_signal(get_signal(name), 60.0, DEFAULT_GROUP_BY)

    assert result.error is None
    assert not result.invalid
    assert {s.labels["instance"] for s in result.series} <= {INSTANCE}
    assert not source.last_errors and not source.warming_up()


async def test_the_vllm_target_has_no_router_series() -> None:
    source, _ = both_targets()
    result = await source.query_signal(get_signal("routed_request_rate"), 60.0, DEFAULT_GROUP_BY)
    assert {s.labels["instance"] for s in result.series} == {ROUTER_INSTANCE}
    assert MODEL not in {s.labels.get("model_name") for s in result.series}
