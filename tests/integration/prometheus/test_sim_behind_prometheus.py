"""The simulator behind a real Prometheus: Prometheus stores its `vllm:` series under their own names,
and every catalog signal read through Prometheus equals the same signal read by the scrape source
from the same simulator at the same moment.

"Equal" within what the two windows allow. Prometheus and the scrape source sample the simulator at
different instants, so the test arranges moments where that cannot matter:

- counters: a burst of traffic between two quiet periods, and windows that start before the burst
  and end after it. Both sources then see the same increases; ratios, per-position shares and
  histogram quantiles must agree to 1e-9. A plain rate's denominator is each source's own time span
  (Prometheus extrapolates, the scrape source does not), so each rate must lie between the
  simulator's own total increase over the window and that increase over the window less two scrape
  intervals.
- gauges: per-engine values held constant (different on each of two engines) for longer than the
  window, so the aggregation across engines is checked, not the sampling instants.
- the derived estimated_speedup, computed from each source's inputs, agrees as the ratios do.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.daemon.readings import speedup
from specguard.rules.router_signals import ROUTER_SIGNALS
from specguard.rules.signals import CATALOG, DEFAULT_GROUP_BY, Kind, Signal
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sources.base import Source, SourceResult
from specguard.sources.prometheus import PrometheusSource
from specguard.sources.scrape import ScrapeSource
from specguard.store.baseline import parse_baseline
from tests.prometheus_server import running_prometheus

# The vLLM signals: the router's read its own page (tests/unit/sources/test_router_target.py).
VLLM_SIGNALS = {name: s for name, s in CATALOG.items() if s not in ROUTER_SIGNALS}

pytestmark = pytest.mark.real

SCRAPE_EVERY = 1.0  # both sources
RATE_SIGNALS = {name for name, signal in VLLM_SIGNALS.items() if signal.kind is Kind.RATE}
GAUGE_SIGNALS = {name for name, signal in CATALOG.items() if signal.kind is Kind.GAUGE}
KV_FLOORS = (0.8, 0.3)  # engine 0, engine 1


async def _refresh_forever(source: ScrapeSource) -> None:
    while True:
        await source.refresh()
        await asyncio.sleep(SCRAPE_EVERY)


async def _prometheus_samples(prometheus_url: str, since: float) -> int:
    """How many scrapes Prometheus stored since ``since`` (Unix time)."""
    query = f"count_over_time(up[{max(1, math.ceil(time.time() - since))}s])"
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{prometheus_url}/api/v1/query", params={"query": query}) as response,
    ):
        result = (await response.json())["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


async def _settle(prometheus_url: str, source: ScrapeSource, scrapes: int = 3) -> None:
    """Wait until both sources took ``scrapes`` samples from now on."""
    since = time.time()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ring = source._rings[source.targets[0]]
        ours = sum(1 for ts, _ in ring if ts >= since)
        if ours >= scrapes and await _prometheus_samples(prometheus_url, since) >= scrapes:
            return
        await asyncio.sleep(0.2)
    pytest.fail("the sources did not take their samples within 60 s")


async def _traffic(sim: Simulator) -> None:
    """A burst of chat and completion requests at several temperatures; some get preempted."""
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> None:
            path = "/v1/chat/completions" if i % 2 else "/v1/completions"
            body: dict[str, Any] = {
                "max_tokens": 40 + 13 * (i % 7),
                "temperature": (i % 4) * 0.4,
                "ignore_eos": bool(i % 3),
            }
            if i % 2:
                body["messages"] = [{"role": "user", "content": f"question {i} " * 6}]
            else:
                body["prompt"] = f"prompt {i} " * 5
            async with session.post(sim.url + path, json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()

        for batch in range(4):
            await asyncio.gather(*(one(batch * 10 + i) for i in range(10)))


@contextlib.asynccontextmanager
async def _sources(
    sim: Simulator, prometheus_url: str
) -> AsyncIterator[tuple[PrometheusSource, ScrapeSource]]:
    scrape = ScrapeSource([sim.url + "/metrics"], timeout=5.0, retention=600.0)
    through_prometheus = PrometheusSource(prometheus_url, timeout=10.0)
    refresher = asyncio.create_task(_refresh_forever(scrape))
    try:
        yield through_prometheus, scrape
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher
        await scrape.close()
        await through_prometheus.close()


BASELINE = parse_baseline(
    {"version": 2, "measured_at": "2026-12-01T00:00:00Z", "entries": [{"speculative": {"method": "eagle3"}}]}
)


async def _read(source: Source, signal: Signal, window: float) -> SourceResult:
    """A signal as the daemon reads it; a derived one from its inputs."""
    if signal.kind is not Kind.SPEEDUP:
        return await source.query_signal(signal, window, DEFAULT_GROUP_BY)
    inputs = [await source.query_signal(CATALOG[name], window, DEFAULT_GROUP_BY) for name in signal.inputs]
    return speedup(signal, *inputs, BASELINE)


def _by_labels(result: SourceResult) -> dict[tuple[tuple[str, str], ...], float]:
    assert result.error is None, result.error
    return {tuple(sorted(series.labels.items())): series.value for series in result.series}


async def test_every_catalog_signal_reads_the_same_through_prometheus_and_the_scrape_source(
    tmp_path: Path, unused_tcp_port: int
) -> None:
    options = SimOptions(
        port=0,
        speculative=SpeculativeConfig("draft_model", "tiny-draft", 3),
        acceptance_by_position=[0.8, 0.6, 0.5],
        temperature_decay=0.5,
        data_parallel_size=2,
        step_time=0.004,
        max_model_len=256,
        kv_capacity_tokens=300,  # two long requests fill an engine: some are preempted
        seed=7,
    )
    sim = await start_simulator(options)
    target = sim.url.removeprefix("http://")
    try:
        async with (
            running_prometheus(target, tmp_path, unused_tcp_port) as prometheus,
            _sources(sim, prometheus.url) as (through_prometheus, scrape),
        ):
            await _settle(prometheus.url, scrape)
            started = time.time()
            await _traffic(sim)
            await _settle(prometheus.url, scrape)
            window = float(math.ceil(time.time() - started) + 2)  # one quiet sample before the burst
            counters = {
                "generation_throughput": sum(e.counters.generation_tokens for e in sim.engines),
                "request_rate": sum(sum(e.counters.finished.values()) for e in sim.engines),
                "preemption_rate": sum(e.counters.preemptions for e in sim.engines),
            }
            answers = {}
            for name, signal in VLLM_SIGNALS.items():
                if name not in GAUGE_SIGNALS:
                    answers[name] = (
                        await _read(through_prometheus, signal, window),
                        await _read(scrape, signal, window),
                    )

            # Gauges: constant, different per engine, for longer than the window.
            for engine, floor in zip(sim.engines, KV_FLOORS, strict=True):
                engine.set_kv_usage_floor(floor)
            await _settle(prometheus.url, scrape, scrapes=4)
            for name in GAUGE_SIGNALS:
                answers[name] = (
                    await through_prometheus.query_signal(CATALOG[name], 3.0, DEFAULT_GROUP_BY),
                    await scrape.query_signal(CATALOG[name], 3.0, DEFAULT_GROUP_BY),
                )
            stored = await through_prometheus.query_expr("vllm:spec_decode_num_drafts_total")
            escaped = await through_prometheus.query_expr('count({__name__=~"vllm_.+"})')
    finally:
        await sim.stop()

    # Prometheus stored vLLM's names as exported: one drafts series per engine, no `vllm_` twins.
    assert sorted(series.labels["engine"] for series in stored.series) == ["0", "1"]
    assert escaped.series == ()
    assert counters["preemption_rate"] > 0  # the traffic really exercised every counter

    instance = {"instance": target, "model_name": "tiny-llama"}
    for name, (prom, ours) in answers.items():
        prom_values, our_values = _by_labels(prom), _by_labels(ours)
        assert prom_values.keys() == our_values.keys(), name
        assert prom_values, f"{name}: no data"
        for labels in prom_values:
            assert dict(labels) == {**instance, **{k: v for k, v in labels if k == "position"}}, name
        if name in RATE_SIGNALS:
            ((_, prom_rate),) = prom_values.items()
            ((_, our_rate),) = our_values.items()
            low, high = counters[name] / window, counters[name] / (window - 2 * SCRAPE_EVERY - 0.5)
            assert low * (1 - 1e-9) <= prom_rate <= high, (name, low, prom_rate, high)
            assert low * (1 - 1e-9) <= our_rate <= high, (name, low, our_rate, high)
        else:
            assert prom_values == pytest.approx(our_values, rel=1e-9, abs=1e-12), name

    ((_, kv),) = _by_labels(answers["kv_cache_usage"][1]).items()
    assert kv == pytest.approx(max(KV_FLOORS))  # the fullest engine
    ((_, k),) = _by_labels(answers["num_speculative_tokens"][1]).items()
    assert k == 3
