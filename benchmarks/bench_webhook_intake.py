"""Alertmanager webhook intake: requests/s and latency of specguard's ``POST /alertmanager`` against
a bare aiohttp handler that answers 200 without storing anything, in the same run.

Two servers, each in its own process (the load generator is this process, so no two of them share a
GIL; the machine's cores are shared, and the table says how many there are):

- specguard: a real ``specguard run`` with a webhook token, a state directory in a temporary
  directory, one alert rule (``alert: {match: {alertname: Bench}}``, severity info so that its
  ``log`` action writes below the log level, warning), and its scrape source pointed at a local port
  nothing listens on (no vLLM);
- bare: an aiohttp app with the same server settings (no access log, the same keep-alive) whose
  handler reads the body and answers ``{"status": "ok"}``.

Every request is a version 4 payload from tests/am_payloads.py with two alerts and a bearer token.
The alerts' labels (and so their fingerprints) are new in every request: every delivery is new to
specguard and must be stored before it is answered, the hard case.

1. Closed loop: ``--concurrency`` workers, each on its own keep-alive connection, send one request
   after another for ``--warmup`` + ``--seconds``; the requests answered within the measured
   seconds give requests/s, p50 and p99. Rounds alternate bare, specguard, bare, specguard...
   (``--rounds``, medians reported), so a noisy machine slows both alike.
2. Repeated deliveries: one closed-loop run that sends payloads specguard already stored (each
   answered 200 "duplicate", written as a delivery without new alerts).
3. Open loop: requests sent at a fixed rate, half the bare throughput (or specguard's throughput if
   that is lower), whatever the answers do, against both servers, alternating; the latency of every
   request due in the measured seconds is counted from the moment it was due, however late its
   answer came, so a stall is not hidden by sending less.

CPU is read from /proc for each run: the server under load, the load generator, the other (idle)
server, and everything else on the machine; specguard keeps acting on the alerts it took in while
the bare server is measured, and the table shows how much.

Then specguard is stopped (SIGTERM) and its SQLite database is read: every delivery answered 2xx
must be a row of ``deliveries`` and its new alerts rows of ``alert_receipts``. A 2xx delivery
missing from the store fails the benchmark (exit 1). Targets: at least half the
bare throughput, p99 under 20 ms at the open-loop rate, every 2xx stored, none lost.

Linux only (/proc, for CPU time). About 3 minutes with the defaults. Run:
    .venv/bin/python benchmarks/bench_webhook_intake.py [--write benchmarks/results/webhook_intake.md]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from intake_load import Payloads, Run, Server, closed_loop, cpu_seconds, open_loop
from intake_report import Results, median_of, report, say
from intake_servers import check_store, serve_bare, stop, wait_listening, write_specguard_config
from ports import free_ports

ROOT = Path(__file__).resolve().parents[1]


async def benchmark(args: argparse.Namespace, directory: Path) -> Results:
    code = revision()  # before the run: what the daemon started from
    port, bare_port, unused = free_ports(3)
    config = write_specguard_config(directory, port, unused)
    log = directory / "specguard.log"
    with log.open("wb") as out:
        guard = Server(
            "specguard",
            f"http://127.0.0.1:{port}",
            subprocess.Popen(
                [sys.executable, "-m", "specguard", "run", "--config", str(config), "--log-format", "json"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
            ),
        )  # fmt: skip
    bare = Server(
        "bare",
        f"http://127.0.0.1:{bare_port}",
        subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(bare_port)],
            stdin=subprocess.DEVNULL, cwd=ROOT,
        ),
    )  # fmt: skip
    guard_started = time.monotonic()
    guard_cpu = guard_seconds = 0.0
    payloads = Payloads("Bench" if args.acted_on else "Load")
    closed: list[Run] = []
    opened: list[Run] = []
    duplicates: Run | None = None
    try:
        await wait_listening(guard, log)
        await wait_listening(bare, None)
        for round_ in range(args.rounds):
            for server in (bare, guard):
                idle = guard if server is bare else bare
                run = await closed_loop(
                    server, idle, payloads.make, args.concurrency, args.warmup, args.seconds
                )
                closed.append(run)
                say(f"closed loop, round {round_ + 1}", run)
        if args.duplicate_seconds > 0 and guard.tally.stored_bodies:
            pool = list(guard.tally.stored_bodies)
            turn = iter(range(10**9))

            def repeated() -> tuple[bytes, tuple[str, ...]]:
                return pool[next(turn) % len(pool)], ()

            duplicates = await closed_loop(
                guard, bare, repeated, args.concurrency, args.warmup, args.duplicate_seconds, "duplicates"
            )
            say("repeated deliveries", duplicates)
        bare_rps = median_of(closed, "bare", lambda r: r.throughput)
        guard_rps = median_of(closed, "specguard", lambda r: r.throughput)
        if args.rate:
            rate, rate_from = args.rate, "given with --rate"
        elif guard_rps < bare_rps / 2:
            rate, rate_from = guard_rps, "specguard's closed-loop throughput (lower than half the bare one)"
        else:
            rate, rate_from = bare_rps / 2, "half the bare closed-loop throughput"
        for round_ in range(args.rounds):
            for server in (bare, guard):
                idle = guard if server is bare else bare
                run = await open_loop(server, idle, payloads, rate, args.warmup, args.open_seconds)
                opened.append(run)
                say(f"open loop at {rate:.0f} req/s, round {round_ + 1}", run)
    finally:
        if guard.process.poll() is None:
            guard_cpu = cpu_seconds(guard.process.pid)
            guard_seconds = time.monotonic() - guard_started
        stopped = stop(guard)
        stop(bare)
    store = check_store(directory / "state" / "specguard.db", guard.tally, stopped, log)
    return Results(
        closed,
        duplicates,
        opened,
        rate,
        rate_from,
        payloads.size,
        bare.tally,
        guard.tally,
        store,
        code,
        guard_cpu,
        guard_seconds,
    )


def revision() -> str:
    """The commit the daemon ran from, and whether its code had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--",
                "daemon",
                "config",
                "store",
                "dispatch",
                "rules",
                "actions",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown revision"
    return f"commit {head}" + (" with uncommitted changes to its code" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop workers (default 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per closed-loop run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each run is measured")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind (default 3)")
    parser.add_argument("--open-seconds", type=float, default=8.0, help="measured seconds per open-loop run")
    parser.add_argument("--duplicate-seconds", type=float, default=6.0, help="repeated deliveries (0: none)")
    parser.add_argument("--rate", type=float, help="open-loop rate (default: half the bare throughput)")
    parser.add_argument(
        "--acted-on",
        action="store_true",
        help="every alert is one specguard's alert rule takes: each fires a series and runs its action "
        "(the worst case; by default the alerts are stored and no rule acts on them)",
    )
    parser.add_argument("--write", type=Path, help="also write the tables to this markdown file")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare is not None:
        asyncio.run(serve_bare(args.serve_bare))
        return
    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as directory:
        results = asyncio.run(benchmark(args, Path(directory)))
    text, kept = report(results, args)
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text("# Webhook intake benchmark\n\n" + text + "\n")
    if not kept:
        print("FAILED: deliveries answered 2xx are missing from the store", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
