"""A fleet on loopback for the coordination tests: N serving hosts (the simulator as vLLM, under
tests/supervisor.py as systemd would restart it, each writing its own lifecycle log), each watched
by its own `specguard run` process whose `vllm_restart` ladder is wired to it, all sharing one
coordination store. What the simulators' own logs say of their restarts is what the tests judge."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specguard.sim.traffic import Traffic
from tests.fleetstores import StoreServer, etcd_server, redis_server
from tests.ports import free_port
from tests.processes import Daemon, specguard
from tests.vllm_host import Host

RULES = """\
rules:
  - name: acceptance_critical
    signal: acceptance_rate
    window: 3s
    interval: 1s
    condition: "< 0.3"
    severity: critical
    actions: [shrink]
"""


@contextlib.contextmanager
def started_store(kind: str, directory: Path) -> Iterator[StoreServer]:
    """A real etcd or Redis on loopback, stopped at the end."""
    with redis_server(directory) if kind == "redis" else etcd_server(directory) as server:
        yield server


@dataclass(frozen=True)
class Restart:
    """One restart of a host's server, as its own lifecycle log says: asked to stop at ``stopped``,
    serving again at ``serving`` (None: not yet)."""

    host: int
    stopped: float
    serving: float | None
    k: int | None  # the k it came back with


def restarts(log: Path, host: int) -> list[Restart]:
    """The restarts in one simulator's lifecycle log (its first start is none)."""
    if not log.exists():
        return []
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    found: list[Restart] = []
    for i, event in enumerate(events):
        if event["event"] != "stopping":
            continue
        back = next((e for e in events[i + 1 :] if e["event"] == "serving"), None)
        found.append(
            Restart(
                host, event["at"], None if back is None else back["at"], None if back is None else back["k"]
            )
        )
    return found


def most_at_once(all_restarts: Sequence[Restart], now: float) -> int:
    """The most restarts under way at one instant (a restart not over yet lasts until ``now``)."""
    edges = sorted(
        [(r.stopped, 1) for r in all_restarts]
        + [(r.serving if r.serving is not None else now, -1) for r in all_restarts],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def waves(all_restarts: Sequence[Restart]) -> list[list[int]]:
    """The restarts in start order, grouped: a new wave begins with a restart that starts after
    one of the current wave's restarts is over."""
    grouped: list[list[Restart]] = []
    for r in sorted(all_restarts, key=lambda r: r.stopped):
        if grouped and all(o.serving is None or r.stopped < o.serving for o in grouped[-1]):
            grouped[-1].append(r)
        else:
            grouped.append([r])
    return [[r.host for r in wave] for wave in grouped]


class FleetHost:
    """One serving host and the specguard daemon watching it."""

    def __init__(self, root: Path, index: int, coordination: dict[str, Any], startup_delay: float) -> None:
        self.index = index
        self.dir = root / f"host-{index}"
        self.dir.mkdir(parents=True)
        self.lifecycle = self.dir / "lifecycle.jsonl"
        # acceptance collapses at the traffic's temperature (1.5): 0.9 * exp(-3 * 1.5) per position
        self.server = Host(self.dir, "env", "--temperature-decay", "3", "--startup-delay", f"{startup_delay:g}",
                           "--lifecycle-log", str(self.lifecycle))  # fmt: skip
        self.port = free_port()
        (self.dir / "rules.yaml").write_text(RULES)
        shrink = {
            "type": "vllm_restart", "ladder": [4, 2], "url": self.server.url,
            "env_file": {"path": str(self.server.path)}, "command": self.server.command,
            "health_timeout": "60s", "verify_requests": 2, "verify_max_tokens": 8,
        }  # fmt: skip
        self.config = self.dir / "specguard.yaml"
        self.config.write_text(json.dumps({
            "server": {"port": self.port}, "state_dir": "state", "interval": "1s", "rules": ["rules.yaml"],
            "sources": {"scrape": {"targets": [f"{self.server.url}/metrics"]}}, "actions": {"shrink": shrink},
            "coordination": {**coordination, "host": f"host-{index}"},
        }))  # fmt: skip
        self.daemon = Daemon(self.config, self.port, self.dir / "specguard.log")
        self.traffic = Traffic(self.server.url, "tiny-llama", concurrency=1, max_tokens=16, temperature=1.5)

    def restarts(self) -> list[Restart]:
        return restarts(self.lifecycle, self.index)

    async def ladder(self) -> dict[str, Any]:
        code, out, err = await specguard("ladder", "show", "--config", str(self.config), "--format", "json")
        assert code == 0, err
        return dict(json.loads(out)[0])

    def logged(self, text: str) -> list[dict[str, Any]]:
        return [line for line in self.daemon.logs() if text in str(line.get("msg", ""))]


class Fleet:
    def __init__(
        self, root: Path, size: int, coordination: dict[str, Any], startup_delay: float = 2.0
    ) -> None:
        self.hosts = [FleetHost(root, i, coordination, startup_delay) for i in range(size)]

    def start_servers(self) -> None:
        for host in self.hosts:
            host.server.start()

    async def start(self) -> None:
        """The servers, then the daemons; once every daemon is ready, the hot traffic to all at once."""
        self.start_servers()
        for host in self.hosts:
            host.daemon.start()
        for host in self.hosts:
            await host.daemon.wait_for(lambda s: s.get("last_evaluation") is not None, timeout=60)
        await asyncio.gather(*(host.traffic.start() for host in self.hosts))

    def restarts(self) -> list[Restart]:
        return [r for host in self.hosts for r in host.restarts()]

    async def stop(self) -> None:
        for host in self.hosts:
            await host.traffic.stop()
        for host in self.hosts:
            if host.daemon.process is not None and host.daemon.process.poll() is None:
                host.daemon.stop()
        for host in self.hosts:
            host.server.stop()

    async def watch(self, until: Any, seconds: float, every: float = 0.1) -> int:
        """Sample the simulators' logs every ``every`` s until ``until()`` holds; the most restarts
        seen under way at once. Fails after ``seconds``."""
        deadline = time.monotonic() + seconds
        most = 0
        while time.monotonic() < deadline:
            most = max(most, most_at_once(self.restarts(), time.time()))
            if await until():
                return most
            await asyncio.sleep(every)
        raise AssertionError(f"not done in {seconds:.0f} s; restarts so far: {self.restarts()}")
