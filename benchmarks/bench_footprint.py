"""The daemon's footprint as an operator sees it: memory, CPU and start-up time, by target count.

`specguard run` in its own process, with the shipped rule pack, a 5 s interval and 1, 8 and 32
scrape targets, each serving a real vLLM 0.32.0 page that moves forward as a busy server's does
(every target on its own port, all served by this process). One daemon per count, started one
after another and then left running side by side until their sample rings are full (the steady
state an operator's daemon lives in):

- start-up: from starting the process to the first 200 from /healthz;
- CPU share: the daemon's user+system time over the measuring window, as a share of one core;
- RSS and peak RSS of the daemon process (/proc/PID/status) at the end of the window.

The 1-target run is the baseline the others are compared with, in the same run. Linux only
(/proc). Run:
    .venv/bin/python benchmarks/bench_footprint.py [--seconds 60] [--settle 360] [--write benchmarks/results/footprint.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from ports import free_ports
from vllm_pages import CAPTURE, grown

INTERVAL = 5.0
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Footprint:
    targets: int
    startup: float  # seconds to the first healthy /healthz
    rss: float  # MiB
    peak: float  # MiB
    cpu: float  # share of one core
    warnings: list[str]  # log lines at WARNING or above


class Pages:
    """The page every target serves: the capture, moved forward once per interval."""

    def __init__(self) -> None:
        self.text = CAPTURE.read_text()
        self.started = time.monotonic()
        self.cached: tuple[int, str] = (-1, "")

    async def handle(self, _: web.Request) -> web.Response:
        step = int((time.monotonic() - self.started) / INTERVAL)
        if self.cached[0] != step:
            self.cached = (step, grown(self.text, step))
        return web.Response(text=self.cached[1], content_type="text/plain")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def memory(pid: int) -> dict[str, float]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


async def poll(session: aiohttp.ClientSession, url: str) -> tuple[int, object] | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return response.status, await response.json()
    except (aiohttp.ClientError, TimeoutError):
        return None


@dataclass
class Running:
    count: int
    process: subprocess.Popen[bytes]
    log: Path
    startup: float
    warm_at: float  # monotonic time every target had two samples


async def start(count: int, directory: Path, runner: web.AppRunner) -> Running:
    *target_ports, port = free_ports(count + 1)
    for each in target_ports:
        await web.TCPSite(runner, "127.0.0.1", each).start()
    targets = [f"http://127.0.0.1:{each}/metrics" for each in target_ports]
    config = directory / f"specguard-{count}.yaml"
    config.write_text(
        json.dumps(
            {
                "server": {"port": port},
                "state_dir": str(directory / f"state-{count}"),
                "interval": f"{INTERVAL:g}s",
                "sources": {"scrape": {"targets": targets}},
            }
        )
    )
    log = directory / f"specguard-{count}.log"
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "specguard", "run", "--config", str(config), "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip
    async with aiohttp.ClientSession() as session:
        while (answer := await poll(session, url + "/healthz")) is None or answer[0] != 200:
            if process.poll() is not None:
                raise SystemExit(f"specguard exited:\n{log.read_text()}")
            await asyncio.sleep(0.02)
        startup = time.monotonic() - started
        deadline = time.monotonic() + 60
        while True:  # every target scraped twice: the rules have rates to read
            answer = await poll(session, url + "/api/status")
            body: dict[str, Any] = answer[1] if answer and isinstance(answer[1], dict) else {}
            sources = body.get("sources", {})
            if sources.get("targets") and not sources.get("warming_up"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"targets still warming up after 60 s:\n{log.read_text()[-3000:]}")
            await asyncio.sleep(0.5)
    return Running(count, process, log, startup, time.monotonic())


async def measure(counts: list[int], seconds: float, settle: float, directory: Path) -> list[Footprint]:
    """Start one daemon per count (one after another, so start-up times are not shared), let each
    run until its sample rings are full, then measure them side by side over ``seconds``."""
    pages = Pages()
    app = web.Application()
    app.router.add_get("/metrics", pages.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    daemons: list[Running] = []
    try:
        for count in counts:
            daemons.append(await start(count, directory, runner))
            print(f"{count} targets: healthy after {daemons[-1].startup:.2f} s", flush=True)
        ready = max(each.warm_at for each in daemons) + settle
        print(f"letting the sample rings fill: measuring in {ready - time.monotonic():.0f} s", flush=True)
        await asyncio.sleep(max(0.0, ready - time.monotonic()))
        before = {each.count: cpu_seconds(each.process.pid) for each in daemons}
        since = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - since
        used = {each.count: cpu_seconds(each.process.pid) - before[each.count] for each in daemons}
        sizes = {each.count: memory(each.process.pid) for each in daemons}
    finally:
        for each in daemons:
            each.process.terminate()
        for each in daemons:
            each.process.wait(timeout=30)
        await runner.cleanup()
    rows = []
    for each in daemons:
        records = [json.loads(line) for line in each.log.read_text().splitlines() if line.startswith("{")]
        warnings = [r["msg"] for r in records if r.get("level") in ("warning", "error", "critical")]
        size = sizes[each.count]
        rows.append(
            Footprint(
                each.count, each.startup, size["VmRSS"], size["VmHWM"], used[each.count] / elapsed, warnings
            )
        )
    return rows


def table(rows: list[Footprint], seconds: float, settle: float) -> str:
    base = rows[0]
    lines = [
        f"`specguard run` with the shipped pack at a {INTERVAL:g} s interval, each target serving a "
        f"real vLLM 0.32.0 page. The daemons ran side by side for {settle:g} s after their targets had "
        f"two samples, so their sample rings were full; then CPU was measured over {seconds:g} s and "
        f"memory at its end "
        f"(Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores). "
        f"Ratios are to the {base.targets}-target run of the same benchmark run.",
        "",
        "| targets | start-up to healthy /healthz | RSS | peak RSS | CPU share of one core | CPU ratio | RSS ratio | warnings in log |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.targets} | {row.startup:.2f} s | {row.rss:.0f} MiB | {row.peak:.0f} MiB | "
            f"{row.cpu * 100:.2f} % | {row.cpu / base.cpu:.1f} | {row.rss / base.rss:.2f} | {len(row.warnings)} |"
        )
    said = sorted({message.split("\n", 1)[0] for row in rows for message in row.warnings})
    if said:
        lines += ["", "Warnings the daemon logged (the shipped pack without a baseline file):", ""]
        lines += [f"- {message}" for message in said]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="the CPU measuring window (default 60)")
    parser.add_argument(
        "--settle",
        type=float,
        default=360.0,
        help="seconds to run before measuring, so every sample ring is full (default 360: the shipped "
        "pack keeps 340 s of samples)",
    )
    parser.add_argument("--targets", default="1,8,32", help="target counts, the first is the baseline")
    parser.add_argument("--write", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args()
    counts = [int(each) for each in args.targets.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        rows = asyncio.run(measure(counts, args.seconds, args.settle, Path(directory)))
    text = table(rows, args.seconds, args.settle)
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text("# Daemon footprint benchmark\n\n" + text + "\n")


if __name__ == "__main__":
    main()
