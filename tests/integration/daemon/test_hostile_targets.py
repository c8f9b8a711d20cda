"""`specguard run` against hostile scrape targets: garbage, UTF-16, HTML, HTTP 500, negative
counters, a histogram without its +Inf bucket, a target that never answers, one that trickles a
byte a second, a 50 MB page and an endless one, all at once. The daemon stays up, its memory stays
bounded, its rounds keep their schedule, each target shows its own trouble in /api/status, and no
rule fires because of any of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile import MODES, HostileServer
from tests.processes import Daemon

RULES = """\
rules:
  # Each would fire on the first value it got (any_queue on a negative one, which only a hostile
  # target gives): no such value may come from a hostile target.
  - {name: any_acceptance, signal: acceptance_rate, window: 30s, interval: 1s, condition: "< 2"}
  - {name: any_latency, signal: e2e_latency_p95, window: 30s, interval: 1s, condition: ">= 0"}
  - {name: any_queue, signal: running_requests, window: 30s, interval: 1s, condition: "< 0"}
  - {name: missing, signal: acceptance_rate, window: 30s, interval: 1s, condition: "< 2", no_data: keep}
"""
SETTLE = 12.0  # seconds of scraping before the checks: two scrape deadlines and then some
MAX_RSS_MB = 250.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Run:
    def __init__(self, daemon: Daemon, server: HostileServer) -> None:
        self.daemon, self.server = daemon, server
        self.status: dict[str, Any] = {}
        self.rss: list[float] = []
        self.evaluations: list[float] = []


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, unused_tcp_port_factory: Callable[[], int]
) -> Iterator[Run]:
    server = HostileServer()
    server.start()
    directory = tmp_path_factory.mktemp("hostile")
    port = unused_tcp_port_factory()
    (directory / "rules.yaml").write_text(RULES)
    targets = "".join(f"      - {{url: '{server.url(mode)}', name: {mode}}}\n" for mode in MODES)
    config = directory / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\nrules: [rules.yaml]\n"
        f"sources:\n  scrape:\n    timeout: 3s\n    targets:\n{targets}"
    )
    daemon = Daemon(config, port, directory / "specguard.log")
    daemon.start()
    result = Run(daemon, server)
    try:
        asyncio.run(_watch(result))
        yield result
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        server.stop()


async def _watch(run: Run) -> None:
    await run.daemon.wait_for(lambda b: True, timeout=30)
    started = time.monotonic()
    assert run.daemon.process is not None
    while time.monotonic() - started < SETTLE:
        run.rss.append(_rss_mb(run.daemon.process.pid))
        _, body = await run.daemon.get("/api/status")
        run.evaluations.append(body["last_evaluation"] or 0.0)
        await asyncio.sleep(0.5)
    _, run.status = await run.daemon.get("/api/status")


def test_the_daemon_stays_up_bounded_and_on_schedule(run: Run) -> None:
    assert run.daemon.process is not None and run.daemon.process.poll() is None
    assert max(run.rss) < MAX_RSS_MB, f"RSS peaked at {max(run.rss):.0f} MB"
    # Rounds every second went on while scrapes waited on slow targets.
    assert run.evaluations[-1] - run.evaluations[0] >= SETTLE - 4
    health = asyncio.run(run.daemon.get("/healthz"))
    assert health[0] == 200, health


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_target_shows_its_own_trouble(run: Run, mode: str) -> None:
    _, state, reason = MODES[mode]
    (target,) = [t for t in run.status["sources"]["targets"] if t["instance"] == mode]
    assert target["state"] == state, target
    if state == "down":
        assert reason in (target["last_error"] or ""), target
        assert target["failures"] >= 1
    else:
        assert target["last_error"] is None and target["last_success"] is not None


def test_no_rule_fires_because_of_a_hostile_target(run: Run) -> None:
    states = {(r["rule"], r["labels"].get("instance")): r for r in run.status["rules"]}
    assert not [key for key, row in states.items() if row["state"] in ("pending", "firing")], states
    for rule in ("any_acceptance", "any_queue"):  # below zero: an error with the reason, not a breach
        row = states[(rule, "negative")]
        assert row["verdict"] == "error" and "impossible" in row["error"], row
    assert ("any_latency", "no-inf-bucket") not in states  # no +Inf bucket: no quantile, no data
