"""What the simulator tests share: starting a simulator, talking to it, reading its metrics."""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from specguard.rules.signals import DEFAULT_GROUP_BY, get_signal
from specguard.sim.engine.records import RequestRecord, StepRecord
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sources.scrape import ScrapeSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODEL = "tiny-llama"
FAST_STEP = 0.002  # seconds: fast enough for thousands of drafts per second of test


def speculative(k: int) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", model="tiny-draft", num_speculative_tokens=k)


@asynccontextmanager
async def running(**overrides: Any) -> AsyncIterator[Simulator]:
    """A simulator on 127.0.0.1, a free port, a fast step and a fixed seed; stopped on exit."""
    settings: dict[str, Any] = {"port": 0, "step_time": FAST_STEP, "seed": 1, "batch_slowdown": 0.0}
    settings.update(overrides)
    simulator = await start_simulator(SimOptions(**settings))
    try:
        yield simulator
    finally:
        await simulator.stop()


async def post(
    session: aiohttp.ClientSession, sim: Simulator, path: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    async with session.post(sim.url + path, json=body) as response:
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await response.json()
        return data


async def chat(session: aiohttp.ClientSession, sim: Simulator, **body: Any) -> dict[str, Any]:
    body.setdefault("messages", [{"role": "user", "content": "Tell me about speculative decoding."}])
    return await post(session, sim, "/v1/chat/completions", body)


async def completion(session: aiohttp.ClientSession, sim: Simulator, **body: Any) -> dict[str, Any]:
    body.setdefault("prompt", "Speculative decoding drafts tokens cheaply and verifies them")
    return await post(session, sim, "/v1/completions", body)


async def stream(
    session: aiohttp.ClientSession, sim: Simulator, path: str = "/v1/chat/completions", **body: Any
) -> list[Any]:
    """The events of a streamed response: parsed JSON chunks, and the final ``"[DONE]"``."""
    if path == "/v1/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": "Tell me about speculative decoding."}])
    else:
        body.setdefault("prompt", "Speculative decoding drafts tokens cheaply and verifies them")
    async with session.post(sim.url + path, json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        text = await response.text()
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def metrics_text(session: aiohttp.ClientSession, sim: Simulator) -> str:
    async with session.get(sim.url + "/metrics") as response:
        assert response.status == 200
        return await response.text()


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


@functools.lru_cache(maxsize=64)
def _samples(text: str) -> tuple[Sample, ...]:
    return tuple(sample for family in text_string_to_metric_families(text) for sample in family.samples)


def value(text: str, sample_name: str, **labels: str) -> float:
    """The one sample named ``sample_name`` whose labels include ``labels``."""
    found = [
        sample.value
        for sample in _samples(text)
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{len(found)} samples {sample_name}{labels}"
    return float(found[0])


def record_of(sim: Simulator, request_id: str) -> RequestRecord:
    matches = [record for record in sim.ground_truth() if record.id == request_id]
    assert len(matches) == 1, f"no ground truth for {request_id}"
    return matches[0]


@dataclass(frozen=True)
class Measured:
    """Speculative-decoding signals measured by specguard's scrape source over one window."""

    acceptance_rate: float
    mean_acceptance_length: float
    by_position: dict[int, float]


async def measure(sim: Simulator, traffic: Awaitable[Any]) -> Measured:
    """Scrape, run ``traffic`` to completion, scrape again; the signals over those two samples."""
    source = ScrapeSource([sim.url + "/metrics"], timeout=5.0, retention=3600.0)
    try:
        await source.refresh()
        await traffic
        await asyncio.sleep(0.01)  # two samples need distinct timestamps
        await source.refresh()
        assert not source.last_errors, source.last_errors
        signals = {}
        for name in ("acceptance_rate", "mean_acceptance_length", "acceptance_by_position"):
            result = await source.query_signal(get_signal(name), 3600.0, DEFAULT_GROUP_BY)
            assert result.error is None, result.error
            signals[name] = result.series
    finally:
        await source.close()
    (rate,) = signals["acceptance_rate"]
    (length,) = signals["mean_acceptance_length"]
    by_position = {
        int(series.labels["position"]): series.value for series in signals["acceptance_by_position"]
    }
    return Measured(rate.value, length.value, by_position)


def expected_acceptance_rate(alpha: float, k: int) -> float:
    """vLLM's accepted / draft tokens under i.i.d. conditional acceptance (speculative-math.md 3)."""
    if alpha == 1:
        return 1.0
    return alpha * (1 - alpha**k) / (k * (1 - alpha))


def accepted_count_variance(alpha: float, k: int) -> float:
    """Variance of the accepted tokens of one draft: P(N >= j) = alpha^j for j = 1..k."""
    mean = sum(alpha**j for j in range(1, k + 1))
    second_moment = sum((2 * j - 1) * alpha**j for j in range(1, k + 1))  # E[N^2] = sum (2j-1) P(N>=j)
    return second_moment - mean**2


def four_sigma_rate(alpha: float, k: int, drafts: int) -> float:
    """4 standard deviations of the measured acceptance rate (sum of N over drafts, / (k * drafts))."""
    return 4 * math.sqrt(accepted_count_variance(alpha, k) / drafts) / k


def four_sigma_share(p: float, drafts: int) -> float:
    """4 standard deviations of a per-position share (a binomial proportion over drafts)."""
    return 4 * math.sqrt(p * (1 - p) / drafts)


async def steps_alone_and_together(options: SimOptions, max_tokens: int) -> dict[float, list[StepRecord]]:
    """The engine's steps, from the ground truth, of one completion alone and then three at once,
    grouped by step: one engine step serves every request that has a step at its time."""
    sim = await start_simulator(options)
    try:
        async with aiohttp.ClientSession() as session:
            alone = await completion(session, sim, max_tokens=max_tokens, ignore_eos=True)
            together = await asyncio.gather(
                *(completion(session, sim, max_tokens=max_tokens, ignore_eos=True) for _ in range(3))
            )
        records = [record_of(sim, r["id"]) for r in (alone, *together)]
    finally:
        await sim.stop()
    steps: dict[float, list[StepRecord]] = {}
    for record in records:
        for step in record.steps:
            steps.setdefault(step.time, []).append(step)
    return steps


def decode_step_costs(steps: Mapping[float, list[StepRecord]]) -> set[tuple[int, float]]:
    """(requests in the step, its cost) of every step that only decodes (no prompt's prefill)."""
    decode_only = [group for group in steps.values() if all(step.draft_tokens for step in group)]
    return {(len(group), round(group[0].cost, 9)) for group in decode_only}
