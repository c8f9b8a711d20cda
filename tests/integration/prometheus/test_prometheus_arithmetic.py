"""Every signal through the Prometheus source equals Prometheus's arithmetic done by hand on the raw
samples it stored: the right window, the right scale, the right aggregation across engines.

The replayed vLLM adds more work at every scrape than at the one before (so a rate over 6 s differs
from one over 15 s, and an `increase()` is not a `rate()`), has two data-parallel engines (one with its KV
cache full), and changes its gauges at every scrape. The test reads the raw samples of each series
from Prometheus at one fixed evaluation time, computes each signal with its own implementation of
Prometheus 2.42's `extrapolatedRate` and `avg_over_time`, and compares, to 1e-9, with what the
Prometheus source answers at that same time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import aiohttp
import pytest

from specguard.rules.router_signals import ROUTER_SIGNALS
from specguard.rules.signals import CATALOG, DEFAULT_GROUP_BY, Kind, Signal
from specguard.sources.base import SourceResult
from specguard.sources.prometheus import PrometheusSource
from tests.replay import ReplayedVllm, histogram_quantile

# The vLLM signals: the router's read its own page (tests/unit/sources/test_router_target.py).
VLLM_SIGNALS = {name: s for name, s in CATALOG.items() if s not in ROUTER_SIGNALS}

if TYPE_CHECKING:  # fixture types; conftest is not imported at run time
    from conftest import MetricsServer, PrometheusServer

pytestmark = pytest.mark.real

WINDOWS = (6.0, 15.0)
_Points = list[tuple[int, float]]  # (milliseconds, value)


async def raw(
    prometheus: str, selector: str, window: float, at: float
) -> dict[tuple[tuple[str, str], ...], _Points]:
    """``selector[window]`` at ``at``: every series' raw samples, as Prometheus stored them."""
    params = {"query": f"{selector}[{window:g}s]", "time": repr(at)}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{prometheus}/api/v1/query", params=params) as response,
    ):
        body = await response.json()
    assert body["status"] == "success", body
    # Prometheus keeps whole milliseconds; in float seconds near 1.8e9 they carry noise of about
    # 2e-7 s, which is 4e-8 of a 6 s window: keep the arithmetic in milliseconds, as Prometheus does.
    return {
        tuple(sorted(item["metric"].items())): [(round(float(t) * 1000), float(v)) for t, v in item["values"]]
        for item in body["data"]["result"]
    }


def extrapolated_rate(points: _Points, start: int, end: int) -> float | None:
    """Prometheus 2.42's ``rate()`` (promql/functions.go, extrapolatedRate), written out again.

    Times in milliseconds, as Prometheus keeps them."""
    if len(points) < 2:
        return None
    increase = points[-1][1] - points[0][1]
    last = 0.0
    for _, value in points:
        if value < last:
            increase += last
        last = value
    to_start, to_end = (points[0][0] - start) / 1000, (end - points[-1][0]) / 1000
    sampled = (points[-1][0] - points[0][0]) / 1000
    average = sampled / (len(points) - 1)
    if increase > 0 and points[0][1] >= 0:
        to_start = min(to_start, sampled * (points[0][1] / increase))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return increase * (interval / sampled) / ((end - start) / 1000)


def grouped(
    series: Mapping[tuple[tuple[str, str], ...], float],
    groups: Sequence[str],
    combine: Callable[[list[float]], float],
) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for labels, value in series.items():
        key = tuple((k, v) for k, v in labels if k in groups)
        out.setdefault(key, []).append(value)
    return {key: combine(values) for key, values in out.items()}


async def by_hand(
    prometheus: str, server: Mapping[str, str], signal: Signal, window: float, at: float
) -> dict[tuple[tuple[str, str], ...], float]:
    """What ``signal`` must be, per group, from the raw samples alone (``server``: the replayed
    vLLM's instance and model labels)."""
    groups = signal.groups(DEFAULT_GROUP_BY)
    end = round(at * 1000)
    start = end - round(window * 1000)

    async def rates(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        found = {
            labels: extrapolated_rate(points, start, end)
            for labels, points in (await raw(prometheus, name, window, at)).items()
        }
        return {labels: value for labels, value in found.items() if value is not None}

    if signal.kind is Kind.RATE:
        return grouped(await rates(signal.metric.names[0]), groups, sum)
    if signal.kind is Kind.GAUGE:
        series = await raw(prometheus, signal.metric.names[0], window, at)
        averages = {labels: sum(v for _, v in points) / len(points) for labels, points in series.items()}
        return grouped(averages, groups, max if signal.combine == "max" else sum)
    if signal.kind in (Kind.RATIO, Kind.PER_POSITION):
        assert signal.denominator is not None
        numerator = grouped(await rates(signal.metric.names[0]), groups, sum)
        outer = [g for g in groups if g != "position"]
        denominator = grouped(await rates(signal.denominator.names[0]), outer, sum)
        return {
            key: signal.offset + value / denominator[tuple((k, v) for k, v in key if k != "position")]
            for key, value in numerator.items()
        }
    if signal.kind is Kind.QUANTILE:
        # Both engines see the same latencies at every scrape: every bucket grows in proportion.
        assert signal.quantile is not None
        return {tuple(sorted(server.items())): histogram_quantile(signal.quantile, signal.metric.names[0])}
    if signal.kind is Kind.POSITIONS:
        return {tuple(sorted(server.items())): 5.0}  # the capture's num_speculative_tokens
    if signal.kind is Kind.CHAIN:
        # S / (S + drafts - drafts accepted whole), the last being each engine's smallest
        # per-position rate (vLLM counts positions as a prefix).
        assert signal.denominator is not None and signal.per_position is not None
        accepted = grouped(await rates(signal.metric.names[0]), groups, sum)
        drafts = grouped(await rates(signal.denominator.names[0]), groups, sum)
        whole: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in (await rates(signal.per_position.names[0])).items():
            engine = tuple((k, v) for k, v in labels if k != "position")
            whole[engine] = min(whole.get(engine, math.inf), value)
        full = grouped(whole, groups, sum)
        return {key: s / (s + drafts[key] - full[key]) for key, s in accepted.items()}
    raise AssertionError(signal.kind)


async def test_rates_gauges_ratios_and_quantiles_are_prometheus_arithmetic_on_the_raw_samples(
    metrics_server: MetricsServer, prometheus: PrometheusServer
) -> None:
    metrics_server.body = ReplayedVllm(vary=True, engines=2)
    server = {"instance": metrics_server.target, "model_name": "tiny-llama"}
    first = time.time()
    while time.time() - first < max(WINDOWS) + 2 or metrics_server.scrapes < max(WINDOWS) + 2:
        await asyncio.sleep(0.5)
    at = round(time.time() - 0.5, 3)  # a moment Prometheus has certainly ingested
    source = PrometheusSource(prometheus.url, timeout=5.0, clock=lambda: at)
    checked = 0
    try:
        for window in WINDOWS:
            for name, signal in VLLM_SIGNALS.items():
                if signal.kind is Kind.SPEEDUP:
                    continue  # derived from two of these; tests/unit/rules/test_evaluation.py
                answer: SourceResult = await source.query_signal(signal, window, DEFAULT_GROUP_BY)
                assert answer.error is None and answer.invalid == (), (name, answer)
                got = {tuple(sorted(s.labels.items())): s.value for s in answer.series}
                want = await by_hand(prometheus.url, server, signal, window, at)
                assert got.keys() == want.keys(), (name, window)
                assert got == pytest.approx(want, rel=1e-9), (name, window)
                checked += 1
        six, fifteen = [
            (await source.query_signal(CATALOG["generation_throughput"], w, DEFAULT_GROUP_BY)).series[0].value
            for w in WINDOWS
        ]
    finally:
        await source.close()
    assert checked == 2 * (len(VLLM_SIGNALS) - 1)
    assert six > fifteen  # the work grows at every scrape: the window matters
    kv = {s.labels.get("engine"): s.value for s in (await _per_engine_kv(prometheus.url, at)).series}
    assert kv["1"] > 0.9 > kv["0"]  # one engine full, the other not: the signal took the full one


async def _per_engine_kv(prometheus: str, at: float) -> SourceResult:
    source = PrometheusSource(prometheus, timeout=5.0, clock=lambda: at)
    try:
        return await source.query_signal(CATALOG["kv_cache_usage"], WINDOWS[0], ("instance", "engine"))
    finally:
        await source.close()
