"""The load: which prompt goes when. A fixed number of requests in flight (``concurrency``), or
arrivals at ``request_rate`` per second with gamma-distributed gaps (``burstiness`` 1 is a Poisson
process; below 1 burstier, above 1 more even), for a number of prompts or a duration, after a
warm-up that is not counted."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from specguard.playbook.bench.client import Result
from specguard.playbook.bench.prompts import Prompt


@dataclass(frozen=True)
class Load:
    concurrency: int | None = None  # requests in flight; None with a request_rate: unbounded
    request_rate: float | None = None  # arrivals per second
    burstiness: float = 1.0
    num_prompts: int | None = None
    duration: float | None = None  # seconds of measured load (num_prompts None)
    warmup: int = 0  # requests before the measured ones, not counted
    seed: int = 0


Send = Callable[[Prompt], Awaitable[Result]]


def order(prompts: Sequence[Prompt], count: int | None, seed: int) -> list[Prompt]:
    """``count`` prompts (cycling through them, shuffled by ``seed``), or all of them once."""
    shuffled = list(prompts)
    random.Random(seed).shuffle(shuffled)
    if count is None:
        return shuffled
    return [shuffled[i % len(shuffled)] for i in range(count)]


async def warm_up(load: Load, prompts: Sequence[Prompt], send: Send) -> list[Result]:
    """The warm-up requests, not counted: caches, compiled graphs and connections ready first."""
    if not load.warmup:
        return []
    return await _closed(order(prompts, load.warmup, load.seed + 1), send, load.concurrency or 1, None, None)


async def run(
    load: Load, prompts: Sequence[Prompt], send: Send, progress: Callable[[Result], None] | None = None
) -> tuple[list[Result], float]:
    """Warm up, then the measured requests; returns their results and the measured seconds."""
    rng = random.Random(load.seed)
    await warm_up(load, prompts, send)
    planned = order(prompts, load.num_prompts, load.seed) if load.num_prompts else None
    started = time.perf_counter()
    deadline = started + load.duration if load.duration else None
    if load.request_rate is None:
        results = await _closed(planned or list(prompts), send, load.concurrency or 1, deadline, progress)
    else:
        results = await _open(planned, prompts, send, load, rng, deadline, progress)
    return results, time.perf_counter() - started


async def _closed(
    planned: Sequence[Prompt],
    send: Send,
    concurrency: int,
    deadline: float | None,
    progress: Callable[[Result], None] | None,
) -> list[Result]:
    """``concurrency`` workers, each sending the next prompt when its last answer is in; with a
    deadline, the prompts cycle until it passes."""
    results: list[Result] = []
    index = 0

    async def worker() -> None:
        nonlocal index
        while True:
            if deadline is not None:
                if time.perf_counter() >= deadline:
                    return
                prompt = planned[index % len(planned)]
            elif index >= len(planned):
                return
            else:
                prompt = planned[index]
            index += 1
            result = await send(prompt)
            results.append(result)
            if progress is not None:
                progress(result)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def _open(
    planned: Sequence[Prompt] | None,
    prompts: Sequence[Prompt],
    send: Send,
    load: Load,
    rng: random.Random,
    deadline: float | None,
    progress: Callable[[Result], None] | None,
) -> list[Result]:
    """Arrivals on a schedule, each sent whatever is in flight (up to ``concurrency`` at once)."""
    assert load.request_rate is not None
    results: list[Result] = []
    gate = asyncio.Semaphore(load.concurrency) if load.concurrency else None
    tasks: list[asyncio.Task[None]] = []
    cycle = order(prompts, None, load.seed)

    async def one(prompt: Prompt) -> None:
        if gate is None:
            result = await send(prompt)
        else:
            async with gate:
                result = await send(prompt)
        results.append(result)
        if progress is not None:
            progress(result)

    shape = load.burstiness
    scale = 1.0 / (load.request_rate * shape)
    next_at = time.perf_counter()
    index = 0
    while True:
        if planned is not None:
            if index >= len(planned):
                break
            prompt = planned[index]
        else:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            prompt = cycle[index % len(cycle)]
        index += 1
        tasks.append(asyncio.create_task(one(prompt)))
        next_at += rng.gammavariate(shape, scale)
        wait = next_at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
    await asyncio.gather(*tasks)
    return results
