"""Talking to the real vLLM of the e2e tier: chat requests, traffic loops, its spec-decode counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

PROMPTS = [
    "Tell me about speculative decoding.",
    "Why does a draft model make serving faster?",
    "What happens when the target rejects a drafted token?",
    "Count from one to ten.",
    "Which temperature keeps acceptance high?",
]
MAX_TOKENS = 32
SERVED_NAME = "tiny-llama"  # the name the e2e server serves its model under


@dataclass(frozen=True)
class VllmServer:
    url: str  # http://127.0.0.1:PORT
    port: int
    model: str  # the served model name
    model_dir: Path
    log: Path
    num_speculative_tokens: int

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"


DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters, summed over engines (this server has one)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: Mapping[str, float]

    def __sub__(self, earlier: SpecCounters) -> SpecCounters:
        assert self.per_position.keys() == earlier.per_position.keys()
        return SpecCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            {p: v - earlier.per_position[p] for p, v in self.per_position.items()},
        )

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.accepted / self.drafts

    @property
    def acceptance_by_position(self) -> dict[str, float]:
        return {p: v / self.drafts for p, v in self.per_position.items()}


def spec_counters(text: str) -> SpecCounters:
    """vLLM's own counters, read with prometheus_client's parser (not specguard's, so that a bug in
    specguard's reading cannot cancel out in a comparison with what specguard computed)."""
    totals: dict[str, float] = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_position: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
            elif sample.name == PER_POSITION:
                position = sample.labels["position"]
                per_position[position] = per_position.get(position, 0.0) + sample.value
    return SpecCounters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], per_position)


async def metrics_text(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/metrics") as response:
        assert response.status == 200, await response.text()
        return await response.text()


async def settled_counters(session: aiohttp.ClientSession, base_url: str) -> SpecCounters:
    """The counters once they stop moving: a response can reach the client a moment before the
    engine's statistics for its last step are recorded."""
    previous = spec_counters(await metrics_text(session, base_url))
    for _ in range(40):
        await asyncio.sleep(0.3)
        current = spec_counters(await metrics_text(session, base_url))
        if current == previous:
            return current
        previous = current
    pytest.fail("vLLM's spec-decode counters kept moving with no traffic")


async def chat(
    session: aiohttp.ClientSession,
    base_url: str,
    temperature: float,
    prompt: str = PROMPTS[0],
    max_tokens: int = MAX_TOKENS,
    model: str = SERVED_NAME,
) -> dict[str, Any]:
    """One chat completion of exactly ``max_tokens`` tokens (``ignore_eos``)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
    }
    async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await response.json()
    assert data["usage"]["completion_tokens"] == max_tokens, data["usage"]
    return data


@dataclass
class Traffic:
    temperature: float
    requests: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raise what stopped the loop early, if anything did."""
        if self.task is not None and self.task.done() and not self.task.cancelled():
            exc = self.task.exception()
            if exc is not None:
                raise exc


@asynccontextmanager
async def traffic_loop(
    session: aiohttp.ClientSession,
    base_url: str,
    temperature: float,
    max_seconds: float = 180.0,
    max_requests: int = 2000,
) -> AsyncIterator[Traffic]:
    """Chat requests one after another until the block ends (bounded in time and count anyway).

    On exit the request in flight is let finish, so no request is cut half-way."""
    traffic = Traffic(temperature)
    stop = asyncio.Event()

    async def loop() -> None:
        deadline = time.monotonic() + max_seconds
        while not stop.is_set() and traffic.requests < max_requests and time.monotonic() < deadline:
            await chat(session, base_url, temperature, PROMPTS[traffic.requests % len(PROMPTS)])
            traffic.requests += 1

    traffic.task = asyncio.create_task(loop())
    try:
        yield traffic
    finally:
        stop.set()
        await traffic.task
