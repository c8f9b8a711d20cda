"""How much an evaluation round costs the scrape source, relative to parsing one /metrics page.

Baseline: prometheus_client parsing a real vLLM 0.32.0 page (every family), the unavoidable cost
of reading vLLM directly. Measured against it, in the same process and run:

- ``parse_exposition``: specguard's parse, which reads only the lines of the families the catalog
  names and yields the same samples as the full parse would (tests/unit/sources/test_exposition.py);
- one scrape from the page's bytes to the snapshot stored in the target's ring (decode, parse,
  store): what each scrape costs, to be 1 ms or less and 8x or more faster than the baseline;
- a round of the shipped pack: the five rules' queries over a ring holding 10 minutes of samples
  at a 15 s scrape interval (what each evaluation costs);
- every catalog signal once over that ring.

Ratios, not seconds, are the result: they stay meaningful on another machine. Run:
    .venv/bin/python benchmarks/bench_scrape_source.py [--write benchmarks/results/scrape_source.md]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from vllm_pages import CAPTURE, grown

from specguard.config.loading import load
from specguard.daemon.evaluation import window_of
from specguard.daemon.readings import read
from specguard.rules.signals import CATALOG, DEFAULT_GROUP_BY, Kind
from specguard.sources.scrape import ScrapeSource
from specguard.store.baseline import parse_baseline
from specguard.store.exposition import parse_exposition

TARGET = "http://127.0.0.1:8000/metrics"


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds per call over ``repeat`` batches."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(20):
            fn()
        runs.append((time.perf_counter() - start) / 20)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--write", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args()

    text = CAPTURE.read_text()
    pages = [grown(text, step) for step in range(41)]  # 10 min at 15 s
    now = 1_000_000.0
    source = ScrapeSource([TARGET], timeout=5, retention=700, clock=lambda: now)
    for i, page in enumerate(pages):
        source.ingest(TARGET, page, now - 15 * (len(pages) - 1 - i))
    loaded = load(None)
    rules = loaded.enabled_rules()

    body = text.encode()
    ticks = itertools.count()
    scraped = ScrapeSource([TARGET], timeout=5, retention=700, clock=lambda: now)

    def scrape_to_snapshot() -> None:
        scraped.ingest(TARGET, body.decode("utf-8", errors="replace"), now + next(ticks))

    def full_parse() -> None:
        for _ in text_string_to_metric_families(text):
            pass

    baseline_file = parse_baseline(
        {
            "version": 2,
            "measured_at": "2026-12-01T00:00:00Z",
            "entries": [{"speculative": {"method": "eagle3"}}],
        }
    )

    def round_of_pack() -> None:
        async def run() -> None:
            for item in rules:
                await read(item, source, baseline_file, window_of(item, loaded.config.interval))

        asyncio.run(run())

    def every_signal() -> None:
        async def run() -> None:
            for signal in CATALOG.values():
                if signal.kind is Kind.SPEEDUP:  # derived from two others, read in the pack's round
                    continue
                await source.query_signal(signal, 300.0, DEFAULT_GROUP_BY)

        asyncio.run(run())

    def empty_loop() -> None:
        async def run() -> None:
            return None

        asyncio.run(run())

    baseline = timed(full_parse, args.repeat)
    loop_cost = timed(empty_loop, args.repeat)  # asyncio.run's own cost, subtracted below
    rows = [
        ("prometheus_client full parse (baseline)", baseline),
        (
            "parse_exposition, the catalog's families only",
            timed(lambda: parse_exposition(text), args.repeat),
        ),
        ("one scrape: page bytes to stored snapshot", timed(scrape_to_snapshot, args.repeat)),
        (
            f"shipped pack, {len(rules)} rules over a 41-sample ring (one round)",
            timed(round_of_pack, args.repeat) - loop_cost,
        ),
        (
            f"all {sum(s.kind is not Kind.SPEEDUP for s in CATALOG.values())} queried catalog signals over a 5 m window",
            timed(every_signal, args.repeat) - loop_cost,
        ),
    ]
    lines = [
        f"Scrape-source costs relative to parsing one real vLLM 0.32.0 page "
        f"(Python {platform.python_version()}, {platform.machine()}).",
        "",
        "| what | ratio to baseline | median per call |",
        "|---|---|---|",
    ]
    for name, seconds in rows:
        lines.append(f"| {name} | {seconds / baseline:.2f} | {seconds * 1000:.2f} ms |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text("# Scrape source benchmark\n\n" + table + "\n")


if __name__ == "__main__":
    main()
