"""specguard against a real vLLM 0.32.0 (CPU build) doing speculative decoding.

The server (see conftest.py) serves a tiny random Llama with itself as the draft, k = 4. Greedy
drafts of the same model are always accepted at temperature 0; at temperature 1.5 the target samples
from a nearly flat distribution and rarely agrees with them. That is the demo's story (acceptance
collapses when traffic moves to a high temperature), on the real thing.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpServer

from specguard.rules.signals import DEFAULT_GROUP_BY, get_signal
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import start_simulator
from specguard.sources.base import Series
from specguard.sources.scrape import ScrapeSource
from tests.e2e.realclient import (
    PROMPTS,
    SpecCounters,
    VllmServer,
    chat,
    metrics_text,
    settled_counters,
    spec_counters,
    traffic_loop,
)
from tests.processes import Daemon, specguard
from tests.vllm_http import PROBES, differences, observe_all

pytestmark = pytest.mark.real

WINDOW = 600.0  # seconds: longer than any test, so a query sees every sample its source took
# Measured on vLLM 0.32.0 (CPU) with this model: exactly 1.0 at temperature 0; at 1.5 it varies from
# run to run (the model is the same; sampling is not seeded) between 0.000 and 0.098. At 1.5 only
# draft position 0 was ever accepted, which alone caps the rate at 1/k = 0.25.
HIGH_ACCEPTANCE = 0.8
LOW_ACCEPTANCE = 0.3


def _positions(series: tuple[Series, ...]) -> dict[str, float]:
    return {s.labels["position"]: s.value for s in series}


def _one(series: tuple[Series, ...]) -> Series:
    assert len(series) == 1, series
    return series[0]


async def _refresh_at_rest(
    source: ScrapeSource, session: aiohttp.ClientSession, server: VllmServer
) -> SpecCounters:
    """Take one sample with ``source`` while no request runs; the counters that sample holds."""
    before = await settled_counters(session, server.url)
    await source.refresh()
    after = spec_counters(await metrics_text(session, server.url))
    assert not source.last_errors, source.last_errors
    assert after == before, "vLLM's counters moved with no traffic"
    return after


async def test_acceptance_through_specguard_equals_vllms_own_counters(
    vllm_server: VllmServer, session: aiohttp.ClientSession, report: Callable[[str], None]
) -> None:
    source = ScrapeSource([vllm_server.metrics_url], timeout=10, retention=WINDOW)
    try:
        before = await _refresh_at_rest(source, session, vllm_server)
        # Mostly temperature 0 (all accepted), and one request at 1.5 (nearly all rejected), so
        # that the ratios checked below are not all exactly 1.
        for prompt, temperature in zip(PROMPTS, (0, 0, 0, 1.5), strict=False):
            await chat(session, vllm_server.url, temperature=temperature, prompt=prompt)
        after = await _refresh_at_rest(source, session, vllm_server)

        rate = await source.query_signal(get_signal("acceptance_rate"), WINDOW, DEFAULT_GROUP_BY)
        mal = await source.query_signal(get_signal("mean_acceptance_length"), WINDOW, DEFAULT_GROUP_BY)
        by_position = await source.query_signal(
            get_signal("acceptance_by_position"), WINDOW, DEFAULT_GROUP_BY
        )
    finally:
        await source.close()

    counted = after - before
    assert counted.drafts > 0 and counted.draft_tokens > 0
    labels = {"instance": f"127.0.0.1:{vllm_server.port}", "model_name": vllm_server.model}
    assert _one(rate.series).labels == labels
    assert _one(rate.series).value == pytest.approx(counted.acceptance_rate, rel=1e-12)
    assert _one(mal.series).value == pytest.approx(counted.mean_acceptance_length, rel=1e-12)

    positions = _positions(by_position.series)
    # One series per draft position: as many as num_speculative_tokens.
    assert sorted(positions) == [str(i) for i in range(vllm_server.num_speculative_tokens)]
    assert positions == pytest.approx(counted.acceptance_by_position, rel=1e-12)
    # Accepted tokens are counted once per position reached, so the bonus-inclusive length is
    # 1 + the sum of the per-position shares.
    assert _one(mal.series).value == pytest.approx(1 + sum(positions.values()), rel=1e-12)
    report(
        f"3 requests at temperature 0, 1 at 1.5: {counted.accepted:.0f}/{counted.draft_tokens:.0f} "
        f"draft tokens accepted in {counted.drafts:.0f} drafts; specguard: acceptance "
        f"{_one(rate.series).value:.4f}, mean acceptance length {_one(mal.series).value:.4f}, "
        f"by position { {p: round(v, 4) for p, v in positions.items()} }"
    )


async def test_eval_once_reports_what_vllm_counted_between_its_two_scrapes(
    vllm_server: VllmServer,
    session: aiohttp.ClientSession,
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
    report: Callable[[str], None],
) -> None:
    # `eval --once` scrapes twice, --sample-gap apart, while traffic runs. A pass-through proxy
    # keeps the two pages it was served, so the expected values come from exactly those pages.
    pages: list[str] = []
    # Seconds vLLM took to serve each page; `eval` waits 5 s at most (its default scrape timeout).
    fetches: list[float] = []

    async def metrics(_: web.Request) -> web.Response:
        started = time.monotonic()
        text = await metrics_text(session, vllm_server.url)
        fetches.append(time.monotonic() - started)
        pages.append(text)
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    proxy = await aiohttp_server(app, host="127.0.0.1")
    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        "  - {name: acceptance, signal: acceptance_rate, window: 1m, condition: '< 0.5'}\n"
        "  - {name: length, signal: mean_acceptance_length, window: 1m, condition: '< 2'}\n"
        "  - {name: positions, signal: acceptance_by_position, window: 1m, condition: '< 0.5'}\n"
    )
    (tmp_path / "specguard.yaml").write_text("rules: [rules.yaml]\n")

    async with traffic_loop(session, vllm_server.url, temperature=0) as traffic:
        await asyncio.sleep(1)  # traffic under way before the first scrape
        code, out, err = await specguard(
            "eval", "--once", "--config", str(tmp_path / "specguard.yaml"),
            "--scrape", f"http://127.0.0.1:{proxy.port}/metrics", "--sample-gap", "4", "--format", "json",
        )  # fmt: skip
    assert code == 0, err
    assert traffic.requests > 0
    assert len(pages) == 2, (fetches, err)
    counted = spec_counters(pages[1]) - spec_counters(pages[0])
    assert counted.drafts > 0

    rows: dict[tuple[str, str | None], dict[str, Any]] = {
        (row["rule"], row["labels"].get("position")): row for row in json.loads(out)
    }
    acceptance = rows[("acceptance", None)]
    assert acceptance["labels"] == {"instance": f"127.0.0.1:{proxy.port}", "model_name": vllm_server.model}
    assert acceptance["value"] == pytest.approx(counted.acceptance_rate, rel=1e-12)
    assert acceptance["state"] == "inactive"
    assert rows[("length", None)]["value"] == pytest.approx(counted.mean_acceptance_length, rel=1e-12)
    positions = {p: row["value"] for (rule, p), row in rows.items() if rule == "positions"}
    assert positions == pytest.approx(counted.acceptance_by_position, rel=1e-12)
    assert len(positions) == vllm_server.num_speculative_tokens
    report(
        f"eval --once over {traffic.requests} requests: acceptance {acceptance['value']:.3f} "
        f"({counted.accepted:.0f}/{counted.draft_tokens:.0f}), mean acceptance length "
        f"{rows[('length', None)]['value']:.3f}; vLLM served the pages in "
        + ", ".join(f"{f:.2f} s" for f in fetches)
    )


async def _rule(
    daemon: Daemon,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float,
    check: Callable[[], None],
) -> dict[str, Any]:
    """The status row of rule ``name`` once it has one series and ``predicate`` holds for it."""

    def rows(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [row for row in body["rules"] if row["rule"] == name]

    body = await daemon.wait_for(
        lambda b: len(rows(b)) == 1 and predicate(rows(b)[0]), timeout=timeout, check=check
    )
    return rows(body)[0]


def _polls(daemon: Daemon) -> str:
    """How fast the daemon answered /api/status while sharing its CPU with vLLM's engine."""
    polls = daemon.polls
    if not polls:
        return "no status polls"
    return f"/api/status over {len(polls)} polls: median {median(polls):.2f} s, slowest {max(polls):.2f} s"


async def test_acceptance_collapses_at_temperature_15_and_specguard_run_fires(
    vllm_server: VllmServer,
    session: aiohttp.ClientSession,
    tmp_path: Path,
    unused_tcp_port: int,
    report: Callable[[str], None],
) -> None:
    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        "  - name: acceptance_low\n"
        "    signal: acceptance_rate\n"
        "    window: 20s\n"
        "    interval: 1s\n"
        "    condition: '< 0.5'\n"
        "    for: 2s\n"
        "    severity: critical\n"
    )
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{listen: 127.0.0.1, port: {unused_tcp_port}}}\nstate_dir: state\ninterval: 1s\n"
        f"sources: {{scrape: {{targets: ['{vllm_server.metrics_url}'], timeout: 5s}}}}\n"
        "rules: [rules.yaml]\n"
    )
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    cold = ScrapeSource([vllm_server.metrics_url], timeout=10, retention=WINDOW)
    hot = ScrapeSource([vllm_server.metrics_url], timeout=10, retention=WINDOW)
    daemon.start()
    try:
        # Temperature 0: the daemon sees high acceptance and stays quiet.
        cold_start = await _refresh_at_rest(cold, session, vllm_server)
        async with traffic_loop(session, vllm_server.url, temperature=0) as traffic:
            quiet = await _rule(
                daemon,
                "acceptance_low",
                lambda row: row["value"] is not None and row["value"] > HIGH_ACCEPTANCE,
                timeout=60,
                check=traffic.check,
            )
            await asyncio.sleep(3)
        assert quiet["state"] == "inactive"
        cold_counted = await _refresh_at_rest(cold, session, vllm_server) - cold_start
        hot_start = await _refresh_at_rest(hot, session, vllm_server)

        # Temperature 1.5: acceptance collapses and the rule fires.
        async with traffic_loop(session, vllm_server.url, temperature=1.5) as traffic:
            firing = await _rule(
                daemon,
                "acceptance_low",
                lambda row: row["state"] == "firing",
                timeout=120,
                check=traffic.check,
            )
            await asyncio.sleep(2)  # enough high-temperature steps for a measure of their own
        hot_counted = await _refresh_at_rest(hot, session, vllm_server) - hot_start

        cold_rate = _one(
            (await cold.query_signal(get_signal("acceptance_rate"), WINDOW, DEFAULT_GROUP_BY)).series
        )
        hot_rate = _one(
            (await hot.query_signal(get_signal("acceptance_rate"), WINDOW, DEFAULT_GROUP_BY)).series
        )
    finally:
        await cold.close()
        await hot.close()
        code = daemon.stop()

    report(
        f"acceptance through specguard: temperature 0 {cold_rate.value:.3f} "
        f"({cold_counted.accepted:.0f}/{cold_counted.draft_tokens:.0f}), temperature 1.5 "
        f"{hot_rate.value:.3f} ({hot_counted.accepted:.0f}/{hot_counted.draft_tokens:.0f}); "
        f"specguard run fired at {firing['value']:.3f}; {_polls(daemon)}"
    )
    assert cold_rate.value == pytest.approx(cold_counted.acceptance_rate, rel=1e-12)
    assert hot_rate.value == pytest.approx(hot_counted.acceptance_rate, rel=1e-12)
    assert cold_rate.value > HIGH_ACCEPTANCE
    assert hot_rate.value < LOW_ACCEPTANCE
    assert firing["value"] < 0.5 and firing["threshold"] == 0.5
    assert firing["labels"] == {"instance": f"127.0.0.1:{vllm_server.port}", "model_name": vllm_server.model}
    assert code == 0
    with sqlite3.connect(tmp_path / "state" / "specguard.db") as db:
        fired = db.execute("SELECT count(*) FROM events WHERE kind='firing'").fetchone()[0]
    assert fired == 1


def _families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _shapes(family: Metric) -> set[tuple[str, frozenset[str]]]:
    """(sample name, label names) of every sample: `_bucket` has `le`, `_count` has not..."""
    return {(sample.name, frozenset(sample.labels)) for sample in family.samples}


async def test_the_simulator_exports_every_family_of_the_real_server_with_its_type_and_labels(
    vllm_server: VllmServer, session: aiohttp.ClientSession
) -> None:
    k = vllm_server.num_speculative_tokens
    speculative = SpeculativeConfig(method="draft_model", model="x", num_speculative_tokens=k)
    sim = await start_simulator(SimOptions(port=0, speculative=speculative))
    try:
        for url in (vllm_server.url, sim.url):
            await chat(session, url, temperature=0, max_tokens=8)
        real = _families(await metrics_text(session, vllm_server.url))
        ours = _families(await metrics_text(session, sim.url))
    finally:
        await sim.stop()

    assert len(real) > 50  # python_*, process_*, http_* and vllm:* families
    missing = sorted(set(real) - set(ours))
    assert not missing, f"families of the real vLLM missing from the simulator: {missing}"
    for name, family in real.items():
        assert ours[name].type == family.type, name
        assert _shapes(ours[name]) == _shapes(family), name
    positions = {s.labels["position"] for s in ours["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
    assert positions == {
        s.labels["position"] for s in real["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
    }


async def test_the_simulator_answers_every_probe_as_the_real_server_does(
    vllm_server: VllmServer, report: Callable[[str], None]
) -> None:
    """tests/vllm_http.py's requests against both: status, client-visible headers, body shapes, and
    the exact text of every error. The fast tier compares with a capture of this server's answers;
    this keeps that capture honest."""
    k = vllm_server.num_speculative_tokens
    speculative = SpeculativeConfig(method="draft_model", model="x", num_speculative_tokens=k)
    sim = await start_simulator(SimOptions(port=0, speculative=speculative, model=vllm_server.model))
    try:
        real = await observe_all(vllm_server.url)
        ours = await observe_all(sim.url)
    finally:
        await sim.stop()
    differ = differences(real, ours)
    assert differ == {}, json.dumps(differ, indent=1)  # whole, for a difference seen once
    report(
        f"{len(PROBES)} HTTP probes: the simulator answered each as vLLM {real['version']['body']['version']} did"
    )


async def test_the_restore_canary_reads_acceptance_from_the_real_server(vllm_server: VllmServer) -> None:
    """The feature_flag's canary, as a restore runs it: a few completions straight to the server,
    its spec_decode counters read before and after. The tiny model drafts for itself, so at
    temperature 0 (the canary's) nearly every draft token is accepted."""
    from specguard.actions.feature_flag.canary import Canary, CanaryParams

    result = await Canary(CanaryParams(url=vllm_server.url, min_acceptance=0.5, requests=4), None).probe()
    assert result.ok, result.detail
    assert result.acceptance is not None and result.acceptance > 0.9
    assert result.drafted >= 32
    assert "at or above 0.5" in result.detail
