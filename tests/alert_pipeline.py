"""The whole alerting path on loopback, with the real binaries: a simulated vLLM, Prometheus
(Debian `prometheus`) scraping it and evaluating specguard's exported rules every second,
Alertmanager (Debian `prometheus-alertmanager`) configured from specguard's exported receiver, and
`specguard run` receiving its webhooks while it scrapes the same simulator directly.

Shared by the integration test and the benchmark that compares the two paths to an action. Every
process is stopped when the context ends; a missing binary skips, or fails under
SPECGUARD_REQUIRE_REAL=1 (tests/real.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.traffic import Traffic
from tests.ports import free_port
from tests.processes import Daemon
from tests.real import require_binary

TOKEN = "pipeline-token-0123456789"
READY_TIMEOUT = 30.0
GOOD, BAD = 0.0, 1.5  # traffic temperatures: acceptance about 0.7, then about 0.04

# One rule, two paths: specguard evaluates `acceptance_low` on its own scrape, Prometheus evaluates
# its export; Alertmanager's notifications of it drive `am_acceptance_low`.
RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    window: 5s
    interval: 1s
    condition: "< 0.5"
    severity: warning
    actions: [log]
  - name: am_acceptance_low
    alert:
      match: {alertname: acceptance_low}
    group_by: [instance, model_name]
    severity: warning
    actions: [log]
"""


async def specguard_output(*args: str, cwd: Path) -> str:
    """stdout of a one-shot `specguard` command; the test fails with its stderr if it fails."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard", *args, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    if process.returncode != 0:
        pytest.fail(f"specguard {' '.join(args)} exited {process.returncode}: {err.decode()}")
    return out.decode()


@dataclass
class Pipeline:
    directory: Path
    sim: Simulator
    traffic: Traffic
    daemon: Daemon
    prometheus_url: str
    alertmanager_url: str
    processes: dict[str, subprocess.Popen[bytes]]

    @property
    def database(self) -> Path:
        return self.directory / "state" / "specguard.db"

    def degrade(self) -> None:
        self.traffic.temperature = BAD

    def recover(self) -> None:
        self.traffic.temperature = GOOD

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.database)) as db:
            return list(db.execute(sql, params))

    def runs(self, rule: str) -> list[tuple[str, str, float]]:
        """(event kind, run status, finished) of the rule's action runs, in order."""
        return [
            (kind, status, finished)
            for kind, status, finished in self.query(
                "SELECT e.kind, r.status, r.finished FROM action_runs r JOIN events e ON e.id = r.event_id "
                "WHERE e.rule = ? ORDER BY r.id",
                rule,
            )
        ]

    def events(self, rule: str) -> list[tuple[str, str, float]]:
        return [
            (kind, trigger, at)
            for kind, trigger, at in self.query(
                "SELECT kind, trigger, at FROM events WHERE rule = ? ORDER BY id", rule
            )
        ]

    def alertmanager_active(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds as active (firing, not silenced)."""
        url = f"{self.alertmanager_url}/api/v2/alerts?active=true&silenced=false&inhibited=false"
        with urllib.request.urlopen(url, timeout=2) as answer:
            alerts: list[dict[str, Any]] = json.load(answer)
        return [a for a in alerts if a["status"]["state"] == "active"]

    def failed_notifications(self) -> float:
        """Webhook notifications Alertmanager could not deliver (and will send again)."""
        with urllib.request.urlopen(f"{self.alertmanager_url}/metrics", timeout=2) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("alertmanager_notifications_failed_total{") and 'integration="webhook"' in line
        )

    async def next_failed_notification(self, what: str) -> None:
        """Until Alertmanager fails to deliver one more webhook notification than now."""
        failed = self.failed_notifications()
        await self.wait(what, lambda: self.failed_notifications() > failed, timeout=60)

    def start_daemon(self) -> None:
        self.daemon.start()

    async def wait(self, what: str, check: Any, timeout: float = 90.0) -> Any:
        """Until ``check()`` returns something true; fails with the logs of every process."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    pytest.fail(f"{name} exited with {process.returncode}:\n{self.logs()}")
            result = check()
            if result:
                return result
            await asyncio.sleep(0.2)
        pytest.fail(f"{what}: not within {timeout:.0f} s\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for name in ("prometheus", "alertmanager", "specguard"):
            path = self.directory / f"{name}.log"
            if path.exists():
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-25:])
                parts.append(f"--- {name} ---\n{tail}")
        return "\n".join(parts)


@contextlib.asynccontextmanager
async def running_pipeline(directory: Path) -> AsyncIterator[Pipeline]:
    prometheus = require_binary("prometheus", "prometheus")
    alertmanager = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    sim = await start_simulator(
        SimOptions(
            port=0,
            step_time=0.004,
            seed=7,
            speculative=SpeculativeConfig(method="draft_model", model="tiny-draft", num_speculative_tokens=4),
        )
    )
    traffic = Traffic(sim.url, sim.options.model, concurrency=4, max_tokens=48, temperature=GOOD)
    await traffic.start()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    daemon: Daemon | None = None
    ports = {name: free_port() for name in ("specguard", "prometheus", "alertmanager")}
    try:
        (directory / "rules.yaml").write_text(RULES)
        (directory / "token").write_text(TOKEN + "\n")
        (directory / "specguard.yaml").write_text(
            f"server: {{port: {ports['specguard']}, webhook_token_file: token}}\n"
            f"sources: {{scrape: {{targets: ['{sim.url}/metrics'], timeout: 2s}}}}\n"
            "state_dir: state\ninterval: 1s\nrules: [rules.yaml]\n"
        )
        config = str(directory / "specguard.yaml")
        await specguard_output(
            "export", "prometheus-rules", "--config", config, "--output", "alerting-rules.yml", cwd=directory
        )
        receiver = await specguard_output(
            "export", "alertmanager-receiver", "--config", config,
            "--credentials-file", str(directory / "token"),
            "--group-wait", "1s", "--group-interval", "2s", "--repeat-interval", "4s",
            cwd=directory,
        )  # fmt: skip
        (directory / "alertmanager.yml").write_text(receiver)
        (directory / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "rule_files: [alerting-rules.yml]\n"
            f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{ports['alertmanager']}']}}]}}]}}\n"
            f"scrape_configs: [{{job_name: vllm, static_configs: [{{targets: ['{sim.url.removeprefix('http://')}']}}]}}]\n"
        )
        processes["alertmanager"] = _spawn(
            directory / "alertmanager.log",
            alertmanager,
            f"--config.file={directory / 'alertmanager.yml'}",
            f"--storage.path={directory / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
            "--cluster.listen-address=",
            "--log.level=debug",
        )
        processes["prometheus"] = _spawn(
            directory / "prometheus.log",
            prometheus,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
            # Prometheus drops notifications sent before it has found its Alertmanager and sends
            # again after this delay (default 1m); resolved alerts go out on the same schedule.
            "--rules.alert.resend-delay=1s",
            "--log.level=warn",
        )
        daemon = Daemon(directory / "specguard.yaml", ports["specguard"], directory / "specguard.log")
        pipeline = Pipeline(
            directory,
            sim,
            traffic,
            daemon,
            f"http://127.0.0.1:{ports['prometheus']}",
            f"http://127.0.0.1:{ports['alertmanager']}",
            processes,
        )
        await _ready(pipeline, f"{pipeline.prometheus_url}/-/ready")
        await _ready(pipeline, f"{pipeline.alertmanager_url}/-/ready")
        daemon.start()
        await daemon.wait_for(lambda status: bool(status["rules"]), timeout=READY_TIMEOUT)
        yield pipeline
    finally:
        await traffic.stop()
        everything = [*processes.values(), *([daemon.process] if daemon and daemon.process else [])]
        for process in everything:
            if process.poll() is None:
                process.terminate()
        for process in everything:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        await sim.stop()


def _spawn(log: Path, *command: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def _ready(pipeline: Pipeline, url: str) -> None:
    async def answered() -> bool:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session,
                session.get(url) as response,
            ):
                return response.status == 200
        except aiohttp.ClientError:
            return False

    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if await answered():
            return
        await pipeline.wait("processes alive", lambda: True, timeout=1)
        await asyncio.sleep(0.1)
    pytest.fail(f"{url} not ready in {READY_TIMEOUT:.0f} s\n{pipeline.logs()}")
