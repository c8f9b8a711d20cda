"""The load generator the demo uses: its counts agree with what the simulator served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import start_simulator
from specguard.sim.traffic import Traffic


async def test_concurrent_workers_count_every_token_the_server_served() -> None:
    sim = await start_simulator(
        SimOptions(
            port=0,
            speculative=SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=4),
            acceptance_by_position=[0.8],
            step_time=0.002,
            seed=3,
        )
    )
    traffic = Traffic(sim.url, "tiny-llama", concurrency=4, max_tokens=32, temperature=0)
    try:
        await traffic.start()
        await _until(lambda: traffic.stats.requests >= 20)
        traffic.temperature = 1.5  # may change while running
        await _until(lambda: any(r.temperature == 1.5 and r.finish_reason for r in sim.ground_truth()))
        await traffic.stop()
        finished = [r for r in sim.ground_truth() if r.finish_reason in ("length", "stop")]
        assert traffic.stats.requests >= 20
        assert traffic.stats.errors == 0
        # A stop cancels workers that may not have read the end of a response the server finished:
        # at most one such request per worker goes uncounted.
        missing = len(finished) - traffic.stats.requests
        assert 0 <= missing <= traffic.concurrency
        served = sorted(r.completion_tokens for r in finished)
        uncounted_at_most = sum(served[len(served) - missing :])
        assert sum(served) - uncounted_at_most <= traffic.stats.tokens <= sum(served)
        assert {r.temperature for r in finished} == {0.0, 1.5}
    finally:
        await sim.stop()


async def test_a_server_that_is_down_counts_errors_without_spinning(unused_tcp_port: int) -> None:
    traffic = Traffic(f"http://127.0.0.1:{unused_tcp_port}", "tiny-llama", concurrency=2)
    started = time.monotonic()
    await traffic.start()
    await asyncio.sleep(1.2)
    await traffic.stop()
    elapsed = time.monotonic() - started
    # Each worker waits 0.5 s after a failure: at most one try per half second, however slow we were.
    assert 2 <= traffic.stats.errors <= traffic.concurrency * (elapsed / 0.5 + 1)
    assert traffic.stats.requests == 0


async def _until(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
