"""Streams through the rendered router on a real nginx arrive token by token: nginx passes each
server-sent event on as the server sends it (proxy_buffering off), so the first chunk comes within
a few milliseconds of when it comes straight from the server, and the chunks keep the server's
pace instead of arriving in a heap at the end."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from specguard.sim.options import SimOptions
from specguard.sim.server import Simulator, start_simulator
from tests.nginx_router import Router, routing_config
from tests.ports import free_port

STEP = 0.03  # the simulator's seconds per step: one token per chunk without speculation
TOKENS = 25
ROUNDS = 7


@pytest.fixture
async def simulator() -> AsyncIterator[Simulator]:
    sim = await start_simulator(SimOptions(port=free_port(), step_time=STEP, seed=3))
    try:
        yield sim
    finally:
        await sim.stop()


async def arrivals(session: aiohttp.ClientSession, base: str) -> list[float]:
    """Seconds from sending a streamed completion to each content chunk's arrival."""
    body = {
        "model": "tiny-llama",
        "prompt": "count",
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.monotonic()
    times = []
    async with session.post(f"{base}/v1/completions", json=body) as response:
        assert response.status == 200
        async for line in response.content:
            text = line.decode().strip()
            if text.startswith("data: ") and text != "data: [DONE]" and json.loads(text[6:])["choices"]:
                times.append(time.monotonic() - started)
    return times


async def test_a_stream_through_nginx_arrives_token_by_token_as_fast_as_straight_from_the_server(
    simulator: Simulator, tmp_path: Path
) -> None:
    server = f"127.0.0.1:{simulator.port}"
    direct_first, routed_first, routed_spread = [], [], []
    with Router(tmp_path, routing_config(server, server, tmp_path / "flag.json")) as router:
        async with aiohttp.ClientSession() as session:
            await arrivals(session, router.url)  # connections opened, nginx's workers warm
            for _ in range(ROUNDS):  # alternating, so that load on the machine falls on both alike
                direct = await arrivals(session, f"http://{server}")
                routed = await arrivals(session, router.url)
                assert len(routed) == len(direct) == TOKENS  # one chunk per token, none merged
                direct_first.append(direct[0])
                routed_first.append(routed[0])
                routed_spread.append(routed[-1] - routed[0])
    added = statistics.median(routed_first) - statistics.median(direct_first)
    # Buffered, the first chunk would wait for the whole response (TOKENS steps, about 1 s).
    print(f"first chunk added {added * 1000:.2f} ms; spread {statistics.median(routed_spread):.3f} s")
    assert added < 0.015, f"first chunk {added * 1000:.1f} ms later through nginx"
    # The chunks keep the server's pace: spread over the steps, not delivered together at the end.
    assert statistics.median(routed_spread) > 0.5 * (TOKENS - 1) * STEP
