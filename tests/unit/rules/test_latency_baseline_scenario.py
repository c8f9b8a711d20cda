"""The shipped latency rules against the baseline `specguard bench` writes, on the traffic that paged
a healthy server: 2 requests in flight, 64 tokens each, at k = 3, every request between 0.5 and
0.8 s. A baseline of the client's e2e p95 (about 0.6 s) against the rule's histogram_quantile
(about 0.78 s inside vLLM's 0.5-0.8 s bucket) fired within 10 minutes on healthy traffic. The
histogram figures bench records now stay quiet on the same traffic, and the same traffic made 30 %
slower fires.

Simulated time (tests/virtual_time.py): the simulator's own engine and its /metrics (vLLM 0.32's
families and buckets), a "bench" read of the page before and after a minute of traffic turned into
the baseline by bench's own code, the daemon's scrape source fed a page every 5 s, and the shipped
rules evaluated by the daemon's evaluation and engine every 15 s. Fourteen simulated minutes take a
few seconds."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

import specguard.sim.engine.engine as sim_engine
from specguard.config.loading import Loaded, LoadedRule, load
from specguard.daemon.evaluation import evaluate_rule
from specguard.playbook.bench import histograms
from specguard.playbook.bench.prompts import builtin
from specguard.playbook.bench.stats import quantile
from specguard.sim.engine.engine import Engine
from specguard.sim.engine.requests import GenerationParams
from specguard.sim.metrics import VllmMetrics
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.tokens import text_token_ids
from specguard.sources.scrape import ScrapeSource
from specguard.store.baseline import Baseline
from specguard.store.exposition import parse_exposition
from specguard.store.records import SeriesState, State, Verdict
from tests.virtual_time import VirtualTimeLoop, clock_module

EPOCH = 1_800_000_000.0
TARGET = "http://127.0.0.1:8000/metrics"
MODEL = "tiny-llama"
STEP = 0.02  # the simulator's default step time
SCRAPE_EVERY = 5.0
EVALUATE_EVERY = 15.0
WARM = 60.0  # traffic before the bench reads the page
BENCH = 60.0  # the bench's measured minute
WATCH = 12 * 60.0  # the daemon watches this long: 10 minutes of `for` after a 5-minute window fills
LATENCY_RULES = ("latency_regression", "latency_mean_regression")
# vLLM 0.32's e2e buckets, as the real server's page has them (tests/fixtures)
E2E_BUCKETS = ("0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0",
               "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf")  # fmt: skip

Tick = Callable[[float, str], Awaitable[None]]


class Traffic:
    """The simulator's engine and metrics with two clients sending the built-in chat and code
    prompts, 64 tokens each (ignore_eos), as `specguard bench --concurrency 2 --max-tokens 64`."""

    def __init__(self, step_time: float) -> None:
        self.options = SimOptions(
            port=0, speculative=SpeculativeConfig("eagle3", "draft", 3), step_time=step_time, seed=7
        )
        self.metrics = VllmMetrics(self.options)
        self.engine: Engine | None = None
        self.prompts = builtin(["chat", "code"])
        self.rng = random.Random(3)
        self.timed: list[tuple[float, float]] = []  # (finished, seconds) of each request

    def page(self) -> str:
        return generate_latest(self.metrics.registry).decode()

    def start(self) -> Engine:
        """The engine, made and started on the clock in force (the simulated one)."""
        self.engine = Engine(self.options, self.metrics)
        self.metrics.attach([self.engine])
        self.engine.start()
        return self.engine

    async def client(self, engine: Engine) -> None:
        while True:
            prompt = self.rng.choice(self.prompts)
            ids = tuple(text_token_ids(prompt.text))
            handle = engine.submit(
                GenerationParams(len(ids), 64, temperature=0.0, ignore_eos=True, prompt_token_ids=ids)
            )
            async for _ in handle.outputs():
                pass
            record = handle.record
            assert record.finished_time is not None
            self.timed.append((record.finished_time, record.finished_time - record.arrival_time))

    def client_p95(self, since: float, until: float) -> float:
        seconds = [s for finished, s in self.timed if since <= finished < until]
        value = quantile(seconds, 0.95)
        assert value is not None
        return value


def play(traffic: Traffic, seconds: float, tick: Tick, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``traffic`` for ``seconds`` of simulated time, calling ``tick(unix time, page)`` every
    SCRAPE_EVERY seconds."""
    loop = VirtualTimeLoop()
    monkeypatch.setattr(sim_engine, "time", clock_module(loop, EPOCH))

    async def main() -> None:
        engine = traffic.start()
        clients = [asyncio.create_task(traffic.client(engine)) for _ in range(2)]
        try:
            while loop.time() < seconds:
                await tick(EPOCH + loop.time(), traffic.page())
                await asyncio.sleep(SCRAPE_EVERY)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            await engine.stop()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def configure(tmp_path: Path, entry: dict[str, Any]) -> Loaded:
    """The shipped pack with a baseline file holding ``entry``, as `specguard run` loads them."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    baseline = {
        "version": 2,
        "measured_at": "2026-12-05T10:00:00Z",
        "method": "specguard bench",
        "entries": [entry],
    }
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    (tmp_path / "specguard.yaml").write_text("baseline: baseline.json\nrules: [builtin:speculative]\n")
    loaded = load(tmp_path / "specguard.yaml")
    assert loaded.ok, [str(p) for p in loaded.errors]
    return loaded


class Watch:
    """The daemon's view: a scrape source fed every page, the latency rules evaluated every
    EVALUATE_EVERY seconds, every verdict and event kept."""

    def __init__(self, loaded: Loaded, start: float) -> None:
        assert loaded.baseline is not None
        self.baseline: Baseline = loaded.baseline
        self.rules: list[LoadedRule] = [r for r in loaded.rules if r.name in LATENCY_RULES]
        assert [r.name for r in self.rules] == list(LATENCY_RULES)
        self.clock = [start]
        self.source = ScrapeSource([TARGET], timeout=5.0, retention=900.0, clock=lambda: self.clock[0])
        self.states: dict[str, dict[str, SeriesState]] = {r.name: {} for r in self.rules}
        self.events: dict[str, list[tuple[State, float]]] = {r.name: [] for r in self.rules}
        self.verdicts: dict[str, list[Verdict]] = {r.name: [] for r in self.rules}
        self.next_evaluation = start

    async def __call__(self, now: float, page: str) -> None:
        self.clock[0] = now
        self.source.ingest(TARGET, page, now)
        if now < self.next_evaluation:
            return
        self.next_evaluation += EVALUATE_EVERY
        for item in self.rules:
            outcome, _ = await evaluate_rule(
                item, self.source, self.baseline, self.states[item.name], now, EVALUATE_EVERY
            )
            self.states[item.name] = {**self.states[item.name], **outcome.states}
            self.events[item.name] += [(event.kind, event.at) for event in outcome.events]
            self.verdicts[item.name] += list(outcome.verdicts.values())

    def state(self, rule: str) -> State:
        (series,) = self.states[rule].values()
        return series.state


class Bench:
    """What `specguard bench` reads: the page before and after its measured minute. Then, if told
    how, the daemon's watch of the traffic that follows (``watch`` makes it from the figures)."""

    def __init__(
        self, traffic: Traffic, watch: Callable[[dict[str, float], float], Tick] | None = None
    ) -> None:
        self.traffic = traffic
        self.make_watch = watch
        self.before: histograms.Reading | None = None
        self.after: histograms.Reading | None = None
        self.watch: Tick | None = None

    async def __call__(self, now: float, page: str) -> None:
        elapsed = round(now - EPOCH, 6)
        if elapsed == WARM:
            self.before = histograms.reading(page, now)
        elif elapsed == WARM + BENCH:
            self.after = histograms.reading(page, now)
            if self.make_watch is not None:
                self.watch = self.make_watch(self.figures(), self.client_p95())
        if self.watch is not None:
            await self.watch(now, page)

    def figures(self) -> dict[str, float]:
        assert self.before is not None and self.after is not None
        return histograms.server_figures(MODEL, [(self.before, self.after)])

    def client_p95(self) -> float:
        return self.traffic.client_p95(EPOCH + WARM, EPOCH + WARM + BENCH)


def test_the_simulators_e2e_histogram_has_vllm_0_32s_buckets() -> None:
    page = Traffic(STEP).page()
    buckets = parse_exposition(page)["vllm:e2e_request_latency_seconds_bucket"]
    assert sorted({dict(labels)["le"] for labels in buckets}, key=float) == list(E2E_BUCKETS)


def test_a_healthy_server_watched_for_ten_minutes_against_its_bench_baseline_never_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watches: dict[str, Watch] = {}
    seen: dict[str, float] = {}

    def start_watching(figures: dict[str, float], client_p95: float) -> Tick:
        seen.update(figures, client_p95=client_p95)
        bench_entry = {"model": MODEL, "signals": figures, "signals_from": "vllm_metrics",
                       "measured_with": "specguard bench: 120 requests, concurrency 2"}  # fmt: skip
        # The baseline of before: the client's p95, written where the rule reads it.
        client_entry = {"model": MODEL, "signals": {**figures, "e2e_latency_p95": client_p95},
                        "measured_with": "specguard bench: 120 requests, concurrency 2"}  # fmt: skip
        start = EPOCH + WARM + BENCH
        watches["histograms"] = Watch(configure(tmp_path / "histograms", bench_entry), start)
        watches["client"] = Watch(configure(tmp_path / "client", client_entry), start)

        async def both(now: float, page: str) -> None:
            for watch in watches.values():
                await watch(now, page)

        return both

    traffic = Traffic(STEP)
    play(traffic, WARM + BENCH + WATCH, Bench(traffic, start_watching), monkeypatch)

    # The scenario as it was seen: the slowest requests inside vLLM's 0.5-0.8 s bucket, where the
    # histogram reads p95 near the bucket's top while the client timed about 0.6 s.
    assert all(seconds < 0.8 for _, seconds in traffic.timed) and seen["client_p95"] > 0.5
    assert seen["e2e_latency_p95"] > 1.2 * seen["client_p95"]
    watch = watches["histograms"]
    for rule in LATENCY_RULES:
        assert watch.events[rule] == [], rule
        assert watch.state(rule) is State.INACTIVE, rule
        assert set(watch.verdicts[rule]) <= {Verdict.OK, Verdict.WARMING_UP}, rule
        assert watch.verdicts[rule].count(Verdict.OK) >= WATCH / EVALUATE_EVERY - 2, rule
    # Against the client's p95, the same healthy traffic pages: what the histogram figures fix.
    assert [kind for kind, _ in watches["client"].events["latency_regression"]] == [
        State.PENDING,
        State.FIRING,
    ]


def test_the_same_traffic_thirty_percent_slower_fires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy = Traffic(STEP)
    bench = Bench(healthy)
    play(healthy, WARM + BENCH + 1, bench, monkeypatch)
    measured = {"model": MODEL, "signals": bench.figures(), "signals_from": "vllm_metrics"}
    watch = Watch(configure(tmp_path, measured), EPOCH)

    slower = Traffic(STEP * 1.3)
    play(slower, WATCH, watch, monkeypatch)

    assert slower.client_p95(EPOCH, EPOCH + WATCH) > 1.2 * bench.client_p95()  # the slowdown is real
    kinds = [kind for kind, _ in watch.events["latency_mean_regression"]]
    assert kinds == [State.PENDING, State.FIRING], watch.events
    assert watch.state("latency_mean_regression") is State.FIRING
