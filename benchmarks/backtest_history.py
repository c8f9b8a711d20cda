"""The backtest benchmark's recorded traffic: a week (or ``--hours``) of per-minute history for 8
simulated vLLM servers, written into a state database through the store's own writer.

Each server is ``tests/week.py``'s ``Server`` on a ``Timeline``: minute by minute its counters and
histograms grow and its cumulative ``/metrics`` text is exposed; each minute's 8 pages are parsed
(``parse_exposition``) and recorded with ``store.history.record`` through ``store.database.Store``
(unsynced, as the daemon's history job records), an hour of scrapes per call. Two models: model-a
(k = 3) on vllm-0..3 and model-b (k = 5) on vllm-4..7, a daily cycle of load and acceptance (busy
09:00-18:00 UTC), and two incidents: vllm-1's draft collapses for an hour (per-token acceptance
0.25) and vllm-6 runs with its KV cache full (0.97, preempting, 1.6 times slower) for two hours.

The baseline file's values are the model's e2e p95 (interpolated in vLLM's buckets, as
``specguard bench`` writes it) and mean over the whole period outside the incidents, from the
generator's own ground truth.

Run by ``bench_backtest.py`` in a process of its own, so that the benchmark's peak RSS is the
replay's: ``python benchmarks/backtest_history.py DIR --hours H`` writes ``DIR/state/specguard.db``
and prints its figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import functools
import json
import resource
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests/

from specguard.store import history
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from tests.week import DAY, E2E_BUCKETS, MONDAY, Conditions, Server, Timeline, quantile

START = MONDAY  # Monday, Nov 30 2026, 00:00 UTC
LEAD = 1800.0  # history recorded before the period, so that its first windows are full
HOUR = 3600.0
SERVERS = 8
COLLAPSE_SERVER, PRESSURE_SERVER = 1, 6
COLLAPSE = (START + DAY + 14 * HOUR, START + DAY + 15 * HOUR)  # Tuesday 14:00-15:00
PRESSURE = (START + 3 * DAY + 13 * HOUR, START + 3 * DAY + 15 * HOUR)  # Thursday 13:00-15:00
MODELS = {"model-a": 3, "model-b": 5}
DRAFT_COST = {"model-a": 0.15}  # a separate draft model's cost; model-b drafts with an EAGLE-3 head


def model_of(i: int) -> str:
    return "model-a" if i < SERVERS // 2 else "model-b"


def conditions(i: int, t: float) -> Conditions:
    busy = 9 <= int(t % DAY // HOUR) < 18
    alpha = (0.78 if model_of(i) == "model-a" else 0.86) + 0.005 * (i % 4) - (0.03 if busy else 0.0)
    load, kv = (1.0, 0.6) if busy else (0.5, 0.3)
    if i == COLLAPSE_SERVER and COLLAPSE[0] <= t < COLLAPSE[1]:
        alpha = 0.25
    if i == PRESSURE_SERVER and PRESSURE[0] <= t < PRESSURE[1]:
        return Conditions(alpha=alpha, load=1.2, kv=0.97, preemptions=3, slowdown=1.6)
    return Conditions(alpha=alpha, load=load, kv=kv)


def servers() -> list[Server]:
    return [
        Server(f"vllm-{i}:8000", model_of(i), MODELS[model_of(i)], functools.partial(conditions, i))
        for i in range(SERVERS)
    ]


def in_incident(i: int, t: float) -> bool:
    return (i == COLLAPSE_SERVER and COLLAPSE[0] <= t < COLLAPSE[1]) or (
        i == PRESSURE_SERVER and PRESSURE[0] <= t < PRESSURE[1]
    )


class Truth:
    """Each model's e2e latencies outside the incidents: bucket counts (cumulative), sum and count."""

    def __init__(self) -> None:
        self.buckets = {m: [0.0] * (len(E2E_BUCKETS) + 1) for m in MODELS}
        self.sum = dict.fromkeys(MODELS, 0.0)
        self.count = dict.fromkeys(MODELS, 0)

    def add(self, model: str, values: list[float]) -> None:
        values = sorted(values)
        counts = self.buckets[model]
        for j, upper in enumerate(E2E_BUCKETS):
            counts[j] += bisect.bisect_right(values, upper)
        counts[-1] += len(values)
        self.sum[model] += sum(values)
        self.count[model] += len(values)

    def baseline(self) -> dict[str, Any]:
        entries = []
        for model in MODELS:
            uppers = [*E2E_BUCKETS, float("inf")]
            p95 = quantile(0.95, list(zip(uppers, self.buckets[model], strict=True)))
            signals = {"e2e_latency_p95": round(p95 or 0.0, 4),
                       "e2e_latency_mean": round(self.sum[model] / self.count[model], 4)}  # fmt: skip
            speculative = {"draft_cost": DRAFT_COST[model]} if model in DRAFT_COST else {"method": "eagle3"}
            entries.append({"model": model, "signals": signals, "speculative": speculative})
        return {"version": 2, "measured_at": "2026-11-20T10:00:00Z", "method": "the generator's ground truth",
                "entries": entries}  # fmt: skip


async def build(path: Path, hours: float) -> dict[str, Any]:
    """``hours`` of history from START (and LEAD before it) into the database at ``path``."""
    fleet = servers()
    timeline = Timeline(fleet)
    truth = Truth()
    store = Store(path)
    await store.open()
    began = time.perf_counter()
    recording = 0.0
    scrapes = 0
    first, end = START - LEAD, START + hours * HOUR
    try:
        minute = first
        while minute < end:
            batch = []
            for _ in range(60):
                if minute >= end:
                    break
                for i, server in enumerate(fleet):
                    made = timeline.advance(server, minute)
                    if minute >= START and not in_incident(i, minute):
                        truth.add(server.model, made.latencies["e2e"])
                    batch.append(
                        (server.instance, minute + 30, parse_exposition(timeline.exposition(server)))
                    )
                    server.truth.clear()
                minute += 60
            scrapes += len(batch)
            at = time.perf_counter()
            await store.call(functools.partial(history.record, scrapes=batch), synced=False)
            recording += time.perf_counter() - at
        await store.call(lambda db: db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone(), synced=False)
    finally:
        await store.close()
    built = time.perf_counter() - began
    db = sqlite3.connect(path)
    rows = db.execute("SELECT COUNT(*) FROM history").fetchone()[0]
    db.close()
    return {
        "seconds": built,
        "record_seconds": recording,
        "scrapes": scrapes,
        "rows": rows,
        "bytes": path.stat().st_size,
        "baseline": truth.baseline(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("directory", type=Path, help="the database goes to DIRECTORY/state/specguard.db")
    parser.add_argument("--hours", type=float, default=168.0, help="hours of history from the period's start")
    args = parser.parse_args()
    path = args.directory / "state" / "specguard.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(asyncio.run(build(path, args.hours))))


if __name__ == "__main__":
    main()
