"""What the weekly report costs: its history's size on disk and the time to build and render it.

The report's targets are absolute: a report over 7 days x all signals x 8 series is built in under
2 s, and its history takes under 50 MB of SQLite. Beside them, a ratio that stays meaningful on
another machine: the build against merely reading and decompressing the same rows (``history.read``
over both weeks), in the same process and run, alternated.

History: 8 simulated vLLM servers (``tests/week.py``: one engine each, k 3 to 5, vLLM's histogram
buckets, a daily cycle of load and acceptance) scraped once a minute for 14 days: the report's week
and the week before, which the report reads for week-over-week change. Each scrape goes the
daemon's way (exposition text, ``parse_exposition``, ``history.record``) into a real SQLite file
through ``store.database.Store``, an hour of scrapes per ``record`` call. The 7-day database (the
target's) is the file copied after the first 7 days; the report is built from the 14-day one. A
noisy fleet's incidents are in it too: each server fires a rule every hour (fired, resolved 20
minutes later, three action runs), 2,688 firings over the two weeks.

Run:
    .venv/bin/python benchmarks/bench_report.py [--write benchmarks/results/report.md]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests/

from specguard.report import charts, render, weekly
from specguard.report.build import build
from specguard.store import history
from specguard.store.baseline import Baseline, parse_baseline
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from tests.week import Conditions, Server, Timeline

T = TypeVar("T")
DAY = 86400.0
START = datetime(2026, 11, 16, tzinfo=UTC).timestamp()  # a Monday: the report's week
BEFORE, END = START - 7 * DAY, START + 7 * DAY
FORMATS = ("html", "md", "json")
MB = 2**20
METHOD = (__doc__ or "").split("\n\n")[2].replace("``", "`")  # the docstring's "History"


def server(i: int) -> Server:
    def at(t: float) -> Conditions:
        busy = 9 <= int(t % DAY // 3600) < 18
        alpha = 0.62 + 0.03 * i - (0.06 if busy else 0.0)
        return Conditions(alpha=alpha, load=1.0 if busy else 0.5, kv=0.6 if busy else 0.3)

    return Server(f"vllm-{i}:8000", f"model-{i}", 3 + i % 3, at)


def baseline(servers: list[Server]) -> Baseline:
    signals = {"e2e_latency_p95": 3.0, "ttft_p95": 0.15, "itl_p50": 0.03}
    entries = [{"model": s.model, "signals": signals, "speculative": {"draft_cost": 0.05}} for s in servers]
    return parse_baseline({"version": 2, "measured_at": "2026-11-01T00:00:00Z", "entries": entries})


def checkpoint(db: sqlite3.Connection) -> None:
    assert db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0, "WAL not checkpointed"


def sizes(path: Path) -> dict[str, float]:
    """A database file's size checkpointed, then vacuumed; history's own figure and its rows."""
    db = sqlite3.connect(path, isolation_level=None)
    checkpoint(db)
    out: dict[str, float] = {"file": path.stat().st_size, "history.size": history.size(db)}
    out["rows"] = db.execute("SELECT COUNT(*) FROM history").fetchone()[0]
    out["hours"] = db.execute("SELECT COUNT(*) FROM history_hours").fetchone()[0]
    db.execute("VACUUM")
    checkpoint(db)
    out["vacuumed"] = path.stat().st_size
    db.close()
    return out


async def timed(work: Awaitable[T]) -> tuple[float, T]:
    began = time.perf_counter()
    result = await work
    return time.perf_counter() - began, result


async def generate(store: Store, servers: list[Server], copy7: Path) -> float:
    """Both weeks, an hour of scrapes per ``record`` call; the seconds ``record`` took in all."""
    timeline = Timeline(servers)
    recording = 0.0
    for hour in range(14 * 24):
        batch = []
        for minute in range(60):
            at = BEFORE + (hour * 60 + minute) * 60.0
            for s in servers:
                timeline.advance(s, at)
                batch.append((s.instance, at + 30, parse_exposition(timeline.exposition(s))))
                s.truth.clear()  # the ground truth is not needed here
        recording += (await timed(store.call(functools.partial(history.record, scrapes=batch), False)))[0]
        if hour == 7 * 24 - 1:
            await store.call(checkpoint, synced=False)
            shutil.copyfile(store.path, copy7)
    return recording


ACTIONS = ("log", "oncall", "fallback")


def incidents(db: sqlite3.Connection, servers: list[Server], start: float, end: float) -> int:
    """An hourly firing per server in ``[start, end)``, resolved 20 minutes later, each acted on by
    three actions (the fallback last, 30 s after the firing); the firings written."""
    count = 0
    with db:
        for hour in range(int((end - start) // 3600)):
            for s in servers:
                at = start + hour * 3600 + 300
                series = f'{{instance="{s.instance}",model_name="{s.model}"}}'
                for kind, when in (("firing", at), ("resolved", at + 1200)):
                    cursor = db.execute(
                        "INSERT INTO events (at, rule, series, labels, kind, previous, value, threshold,"
                        " severity, summary, annotations, shadow, dry_run, since)"
                        " VALUES (?, 'acceptance_low', ?, '{}', ?, '', 0.3, 0.4, 'critical', '', '{}', 0, 0, ?)",
                        (when, series, kind, at - 120),
                    )
                    if kind == "firing":
                        for i, action in enumerate(ACTIONS):
                            db.execute(
                                "INSERT INTO action_runs (event_id, action, status, created, started, finished)"
                                " VALUES (?, ?, 'ok', ?, ?, ?)",
                                (cursor.lastrowid, action, at, at, at + 10 * (i + 1)),
                            )
                count += 1
    return count


async def measure(runs: int, make_runs: int, tmp: Path) -> dict[str, Any]:
    servers = [server(i) for i in range(8)]
    known = baseline(servers)
    store = Store(tmp / "specguard.db")
    await store.open()
    out: dict[str, Any] = {}
    out["firings"] = await store.call(lambda db: incidents(db, servers, BEFORE, END), False)
    out["generate"], out["record"] = await timed(generate(store, servers, tmp / "seven.db"))
    await store.close()
    out["rss generated"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MB

    store = Store(tmp / "specguard.db")  # a fresh connection: the first build is the process's first
    await store.open()
    missing = weekly.charts_missing()

    def built(db: sqlite3.Connection) -> Any:
        return build(
            db,
            START,
            END,
            baseline=known,
            host="bench",
            now=END,
            charts_missing=missing,
            remedies=["fallback"],
        )

    def read(db: sqlite3.Connection, hours: bool = True) -> int:
        return sum(map(len, history.read(db, BEFORE, END, hours=hours).values()))

    out["build cold"], report = await timed(store.call(built, synced=False))
    assert sum(r["fired"] for r in report["rules"]) == out["firings"] // 2  # the report's week's half
    reads, builds, minutes = [], [], []
    for _ in range(runs):
        seconds, out["rows read"] = await timed(store.call(read, synced=False))
        reads.append(seconds)
        builds.append((await timed(store.call(built, synced=False)))[0])
    out["rss built"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for _ in range(runs):  # after the peak RSS is taken: a list of every minute is large
        seconds, out["minutes read"] = await timed(store.call(functools.partial(read, hours=False), False))
        minutes.append(seconds)
    out["read"], out["build"], out["minutes"] = map(statistics.median, (reads, builds, minutes))

    drawing, writing, making = [], [], []
    for i in range(make_runs):
        seconds, drawn = await timed(asyncio.to_thread(charts.charts, report))
        drawing.append(seconds)
        began = time.perf_counter()
        for fmt in FORMATS:
            render.write(report, fmt, tmp / f"render{i}", drawn)
        writing.append(time.perf_counter() - began)
        making.append((await timed(weekly.make(store, START, END, FORMATS, tmp / f"make{i}", known, "b")))[0])
    out["charts"], out["write"], out["make"] = map(statistics.median, (drawing, writing, making))
    out["charts drawn"] = len(drawn)
    await store.close()
    out["size 7"], out["size 14"] = sizes(tmp / "seven.db"), sizes(tmp / "specguard.db")
    return out


def table(f: dict[str, Any], runs: int, make_runs: int) -> str:
    s7, s14 = f["size 7"], f["size 14"]
    scrapes = 14 * 24 * 60 * 8
    ok = {True: "met", False: "**NOT met**"}
    rows = [
        ("7-day database, checkpointed", f"{s7['file'] / MB:.1f} MB", "< 50 MB", ok[s7["file"] < 50 * MB]),
        ("7-day database, vacuumed", f"{s7['vacuumed'] / MB:.1f} MB", "< 50 MB", ok[s7["vacuumed"] < 50 * MB]),
        ("7-day: minute / hour rows, `history.size`, file bytes per minute row", f"{s7['rows']:.0f} / {s7['hours']:.0f}, {s7['history.size'] / MB:.1f} MB, {s7['file'] / s7['rows']:.0f}", "", ""),
        ("14-day database, checkpointed / vacuumed", f"{s14['file'] / MB:.1f} / {s14['vacuumed'] / MB:.1f} MB", "", ""),
        ("14-day: minute / hour rows, `history.size`, file bytes per minute row", f"{s14['rows']:.0f} / {s14['hours']:.0f}, {s14['history.size'] / MB:.1f} MB, {s14['file'] / s14['rows']:.0f}", "", ""),
        (f"`history.read`, 14 days ({f['rows read']} rows decoded): baseline", f"{f['read']:.2f} s", "", "1.00"),
        (f"`history.read(hours=False)`: the {f['minutes read']} minute rows instead", f"{f['minutes']:.2f} s", "", f"{f['minutes'] / f['read']:.2f}"),
        ("`build`, first run in the process", f"{f['build cold']:.2f} s", "< 2 s", ok[f["build cold"] < 2]),
        (f"`build`, median of {runs}", f"{f['build']:.2f} s", "< 2 s", ok[f["build"] < 2]),
        ("`build` / `history.read`", f"{f['build'] / f['read']:.2f}", "", ""),
        (f"charts ({f['charts drawn']} PNGs), median of {make_runs}", f"{f['charts']:.2f} s", "", ""),
        ("writing html + md + json, charts given", f"{f['write']:.2f} s", "", ""),
        (f"`weekly.make` html + md + json, median of {make_runs}", f"{f['make']:.2f} s", "", ""),
        ("peak RSS: after generating / after the builds", f"{f['rss generated']:.0f} / {f['rss built']:.0f} MB", "", ""),
        ("firings in the database (two weeks), each with three action runs", f"{f['firings']}", "", ""),
        (f"generating {scrapes} scrapes / of which `record`", f"{f['generate']:.0f} s / {f['record']:.0f} s", "", ""),
        ("`record` per scrape (hour batches)", f"{f['record'] / scrapes * 1000:.2f} ms", "", ""),
    ]  # fmt: skip
    head = ["| figure | value | target | met / ratio |", "|---|---|---|---|"]
    return "\n".join([*head, *(f"| {' | '.join(r)} |" for r in rows)])


def commit() -> str:
    git = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=sys.path[0]
    )
    return git.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="build and read runs (medians)")
    parser.add_argument("--make-runs", type=int, default=3, help="chart, write and weekly.make runs")
    parser.add_argument("--write", type=Path, help="also write the results to this markdown file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        f = asyncio.run(measure(args.runs, args.make_runs, Path(tmp)))
    text = f"""# The weekly report's cost: history size, build and rendering

{datetime.now(UTC):%a %b %d %H:%M:%S UTC %Y}, commit {commit()}. Python {platform.python_version()}, {platform.machine()}, \
{os.cpu_count()} CPUs, SQLite {sqlite3.sqlite_version}; the database in a temporary directory.

{METHOD}
Sizes after `PRAGMA wal_checkpoint(TRUNCATE)`, then after VACUUM. The ratio's baseline, `history.read`
of the same 14 days, alternates with the builds, {args.runs} runs each; the first build is timed apart.

{table(f, args.runs, args.make_runs)}

`build` beyond reading ({f["build"] - f["read"]:.2f} s): per series, 201 windows (the week, the week before,
7 days, 24 hours of the day, 168 hours), each summed from its rows (about 60 components a row) and
given every figure, latency quantiles included; then the recommendations. Charts and files are
outside the 2 s target; `weekly.make` is all of it (charts drawn once).
"""
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
