"""A central watch over many servers: the shipped rule pack evaluated through the Prometheus source
over a fleet's series in a real Prometheus; one round's time and the daemon's memory.

For each fleet size (default 1, 100 and 1,000 servers; the first is the baseline the others are
compared with, in the same run):

- the fleet's series (benchmarks/fleet_series.py: the catalog's vLLM families with a real vLLM
  0.32.0 page's labels, a distinct ``instance`` per server, ``job="vllm"``; four models with k = 3-5;
  some servers' acceptance collapsing, a few with a full KV cache) are written as OpenMetrics text,
  sampled every 2 s (what the shipped pack's 5 s collapse detector needs of Prometheus's scrape)
  over the last 10 minutes (the pack's longest window is 5 minutes), ending now;
- ``promtool tsdb create-blocks-from openmetrics`` makes them blocks, and a real Prometheus
  (no scraping) serves them on 127.0.0.1, waited for until it counts every series;
- in a process of its own (benchmarks/fleet_round.py) the daemon's parts are built as ``specguard
  run`` builds them and run its rounds: the eight rules of the shipped pack, every one in each
  round, with a baseline file so that the latency and speedup rules read too; round i asks about the
  moment ``end - (rounds - 1 - i) * 15 s`` of the data (the source's clock). Each round's time; the
  process's resident memory before the first round and its peak; the CPU the daemon and Prometheus
  used; each query's time, Prometheus's share of it and the answer's size; the states the rules
  hold at the end; then, for the largest fleet, the round's queries one after another against all
  at once, and a profile of three more rounds;
- then the same daemon near the end of its collapse detector's hour of warm-up (its states filled
  as the warm-up fills them, benchmarks/fleet_warmup.py) and more rounds, a detector's window
  apart: 5 before the warm-ups are complete, those in which they are checked (at most
  ``CHECKS_PER_EVALUATION`` an evaluation: 20 for 1,000 servers) and 6 after: round times and
  memory again.

Prometheus is stopped and every file removed at the end. Linux only (/proc); needs Prometheus's
``prometheus`` and ``promtool``, and for 1,000 servers about 6 GB free in the temporary directory
(the OpenMetrics text, removed once promtool has made its blocks) and as much memory (promtool maps
the text). Targets for 1,000 servers: a round under 2 s, the daemon's peak RSS under 200 MB. Run
(about 2.5 minutes on 2 cores):
    .venv/bin/python benchmarks/bench_fleet_prometheus.py [--write benchmarks/results/fleet_prometheus.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import fleet_series
from benchmarks.fleet_promserver import Prometheus, create_blocks, memory
from benchmarks.fleet_report import Run, report
from benchmarks.ports import free_ports

HERE = Path(__file__).resolve().parent
ROUND_TIMEOUT = 900.0


def run_fleet(count: int, end: int, args: argparse.Namespace, directory: Path, profile: bool) -> Run:
    """Write ``count`` servers' series, load them into a Prometheus of their own, time the rounds."""
    here = directory / f"fleet-{count}"
    here.mkdir()
    text = here / "fleet.om"
    started = time.monotonic()
    with text.open("w") as out:
        written = fleet_series.write(out, count, end, int(args.minutes * 60), args.scrape_every)
    wrote = time.monotonic() - started
    size = text.stat().st_size
    blocks, promtool_peak = create_blocks(text, here / "data")
    text.unlink()  # gigabytes for a large fleet: gone before Prometheus starts
    print(f"{count} servers: {written.series:,} series, {written.samples:,} samples "
          f"({size / 2**20:,.0f} MiB of text in {wrote:.1f} s, blocks in {blocks:.1f} s)", flush=True)  # fmt: skip
    (here / "baseline.json").write_text(json.dumps(fleet_series.baseline()))
    (port,) = free_ports(1)
    with Prometheus(here / "data", port, here) as prometheus:
        loaded_in = prometheus.wait_series(written.series, written.end)
        config = here / "specguard.yaml"
        config.write_text(
            json.dumps(
                {
                    "sources": {"prometheus": {"url": prometheus.url}},
                    "baseline": "baseline.json",
                    "state_dir": str(here / "state"),
                    "interval": f"{args.every:g}s",
                }
            )
        )
        load_before = os.getloadavg()[0]
        done = subprocess.run(
            [sys.executable, str(HERE / "fleet_round.py"), str(config), "--end", str(written.end),
             "--rounds", str(args.rounds), "--every", str(args.every), "--log", str(here / "specguard.log"),
             "--warm", str(args.warm), "--prometheus-pid", str(prometheus.pid),
             *(["--profile"] if profile else [])],
            capture_output=True, text=True, timeout=ROUND_TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"the rounds failed ({done.returncode}):\n{done.stderr[-4000:]}")
        measured: dict[str, Any] = json.loads(done.stdout)
        measured["prometheus_memory"] = memory(prometheus.pid)
        measured["prometheus_ready"] = loaded_in
        measured["load"] = (load_before, os.getloadavg()[0])
        measured["promtool_peak"] = promtool_peak
    log_lines = (here / "specguard.log").read_text().splitlines()
    records = [json.loads(line) for line in log_lines if line.startswith("{")]
    warnings = [r["msg"] for r in records if r.get("level") in ("warning", "error", "critical")]
    shutil.rmtree(here)
    print(f"{count} servers: rounds {', '.join(f'{t:.2f}' for t in measured['rounds'])} s; "
          f"peak RSS {measured['peak']:.0f} MiB", flush=True)  # fmt: skip
    return Run(count, written, size, wrote, blocks, measured, len(log_lines), warnings)


def _sizes(text: str) -> list[int]:
    """``1,100,1000``: fleet sizes, each a positive whole number."""
    try:
        sizes = [int(each) for each in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of whole numbers such as 1,100,1000"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every fleet needs at least one server")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--servers",
        type=_sizes,
        default=[1, 100, 1000],
        help="fleet sizes, the first is the baseline (default 1,100,1000)",
    )
    parser.add_argument(
        "--rounds", type=int, default=20, help="rounds per fleet (default 20): the first, then the later ones"
    )
    parser.add_argument(
        "--every", type=float, default=15.0, help="the daemon's interval: data seconds between rounds"
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=12,
        help="rounds of a daemon near its detectors' warm-up end (default 12; 0: none)",
    )
    parser.add_argument("--scrape-every", type=int, default=2, help="seconds between a server's samples")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of data before the end")
    parser.add_argument("--write", type=Path, help="also write the results to this markdown file")
    args = parser.parse_args()
    counts: list[int] = args.servers
    if args.rounds < 3:
        parser.error("--rounds: give at least 3 (the first, then later ones to take a median of)")
    if args.warm != 0 and args.warm < 4:
        parser.error("--warm: give 0 (none) or at least 4 (rounds before, at and after the warm-up's end)")
    if args.every <= 0 or args.scrape_every < 1:
        parser.error("--every and --scrape-every must be positive")
    if (args.rounds - 1) * args.every + 300 > args.minutes * 60:
        parser.error("--minutes must hold the 5-minute windows of every round")
    end = int(time.time()) // args.scrape_every * args.scrape_every
    with tempfile.TemporaryDirectory(prefix="specguard-fleet-") as directory:
        runs = [
            run_fleet(count, end, args, Path(directory), profile=i == len(counts) - 1)
            for i, count in enumerate(counts)
        ]
    command = "python benchmarks/bench_fleet_prometheus.py " + " ".join(sys.argv[1:])
    text = report(
        runs,
        args,
        command,
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores",
    )
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text + "\n")


if __name__ == "__main__":
    main()
