"""Is `specguard bench`'s client the bottleneck? Its sustained requests/s and tokens/s against the
simulator with a negligible step time, relative to a bare aiohttp loop sending the same streamed
requests and only reading the bytes, in the same process and run (rounds alternate, so both see the
same machine). Target: the bench client sustains at least 80 % of the bare loop.

Both run in this one process with the simulator, as `specguard bench` would against a fast server on
the same host; the simulator's own cost is common to both.

Run:
    .venv/bin/python benchmarks/bench_client.py [--write benchmarks/results/bench_client.md]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
from pathlib import Path

import aiohttp

from specguard.playbook.bench import client
from specguard.playbook.bench.load import Load, run
from specguard.playbook.bench.prompts import Prompt
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import start_simulator

PROMPTS = [Prompt("chat", f"prompt number {i}") for i in range(32)]
MAX_TOKENS = 64
CONCURRENCY = 16


async def bare(url: str, model: str, count: int) -> tuple[int, float]:
    """The same requests, streamed, the bytes read and nothing else: (requests, seconds)."""
    done = 0

    async def worker(session: aiohttp.ClientSession, share: int) -> None:
        nonlocal done
        for i in range(share):
            request = client.body("completions", model, PROMPTS[i % len(PROMPTS)].text, MAX_TOKENS, 0.0, 0)
            async with session.post(url + "/v1/completions", json=request) as answer:
                async for _ in answer.content:
                    pass
            done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session, count // CONCURRENCY) for _ in range(CONCURRENCY)))
        return done, time.perf_counter() - started


async def benched(url: str, model: str, count: int) -> tuple[int, float, int]:
    """`specguard bench`'s client and load: (requests, seconds, output tokens)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def send(prompt: Prompt) -> client.Result:
            request = client.body("completions", model, prompt.text, MAX_TOKENS, 0.0, 0)
            return await client.send(session, url, "completions", request, prompt.klass, 60.0)

        results, seconds = await run(Load(concurrency=CONCURRENCY, num_prompts=count), PROMPTS, send)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    return len(results), seconds, sum(r.output_tokens for r in results)


async def measure(rounds: int, count: int) -> dict[str, float]:
    sim = await start_simulator(
        SimOptions(
            port=0,
            speculative=SpeculativeConfig("draft_model", "d", 4),
            step_time=0.0005,
            max_num_seqs=256,
            seed=1,
        )
    )
    try:
        await bare(sim.url, sim.options.model, CONCURRENCY)  # warm-up: connections, first steps
        ratios, bench_rates, bare_rates, token_rates = [], [], [], []
        for _ in range(rounds):
            n_bare, s_bare = await bare(sim.url, sim.options.model, count)
            n_bench, s_bench, tokens = await benched(sim.url, sim.options.model, count)
            bare_rates.append(n_bare / s_bare)
            bench_rates.append(n_bench / s_bench)
            token_rates.append(tokens / s_bench)
            ratios.append((n_bench / s_bench) / (n_bare / s_bare))
    finally:
        await sim.stop()
    return {
        "bare requests/s": statistics.median(bare_rates),
        "bench requests/s": statistics.median(bench_rates),
        "bench output tokens/s": statistics.median(token_rates),
        "ratio (bench / bare)": statistics.median(ratios),
        "worst round ratio": min(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=320, help="per round and client")
    parser.add_argument("--write", type=Path, help="also write the results to this markdown file")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.rounds, args.requests))
    lines = [
        "# `specguard bench`'s client against a bare aiohttp loop",
        "",
        f"Simulator with a 0.5 ms step, k = 4, {MAX_TOKENS} tokens per request, {CONCURRENCY} in flight, "
        f"{args.requests} requests per client per round, {args.rounds} rounds alternating; medians. "
        f"Python {platform.python_version()}, {platform.machine()}, same process as the simulator.",
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {name} | {value:.2f} |" for name, value in figures.items()),
        "",
        f"Target: ratio at least 0.80. {'Met' if figures['ratio (bench / bare)'] >= 0.8 else 'NOT met'}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
