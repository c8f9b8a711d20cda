"""The webhook intake benchmark's load: Alertmanager payloads, the closed and open loops that send
them, and what each run measured (answers, latencies, CPU from /proc)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

# tests/ is not an installed package; its payload builders are used here
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.am_payloads import alert, message

TOKEN = "bench-webhook-token"
PATH = "/alertmanager"
OPEN_CONNECTIONS = 64  # connections the open loop may use at most


class Payloads:
    """Alertmanager payloads with two alerts whose labels (and fingerprints) no payload repeats.

    ``alertname`` Bench is the one specguard's alert rule takes (every alert then fires a series of
    it and runs its action); any other is stored and acted on by no rule."""

    def __init__(self, alertname: str = "Load") -> None:
        self.alertname = alertname
        self.sent = 0
        self.size = len(self.make()[0])

    def make(self) -> tuple[bytes, tuple[str, ...]]:
        n = self.sent
        self.sent += 1
        alerts = [
            alert(
                {
                    "alertname": self.alertname,
                    "instance": f"vllm-{n % 8}:8000",
                    "severity": "warning",
                    "request": str(n),
                    "replica": replica,
                }
            )
            for replica in ("a", "b")
        ]
        group = f'{{}}:{{alertname="{self.alertname}"}}'
        body = message(*alerts, group_key=group, groupLabels={"alertname": self.alertname})
        return json.dumps(body).encode(), tuple(a["fingerprint"] for a in alerts)


@dataclass
class Tally:
    """Every answer one server gave during the whole benchmark (warm-ups included)."""

    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # no answer: the exception's name
    outcomes: Counter[str] = field(default_factory=Counter)  # 2xx answers by their "status"
    reasons: dict[int, str] = field(default_factory=dict)  # a non-2xx answer's body, one per status
    deliveries: set[int] = field(default_factory=set)  # ids of deliveries answered 2xx
    new_alerts: int = 0  # "new" summed over 2xx answers
    stored_fingerprints: set[str] = field(default_factory=set)  # of deliveries answered "stored"
    stored_bodies: list[bytes] = field(default_factory=list)  # some stored payloads, to repeat

    @property
    def ok(self) -> int:
        return sum(count for status, count in self.statuses.items() if 200 <= status < 300)

    def answered(self, status: int, text: bytes, fingerprints: Sequence[str], body: bytes) -> None:
        self.statuses[status] += 1
        if not 200 <= status < 300:
            self.reasons.setdefault(status, text[:300].decode("utf-8", "replace"))
            return
        answer = json.loads(text)
        outcome = str(answer.get("status"))
        self.outcomes[outcome] += 1
        if "delivery" in answer:
            self.deliveries.add(int(answer["delivery"]))
            self.new_alerts += int(answer["new"])
        if outcome == "stored":
            self.stored_fingerprints.update(fingerprints)
            if len(self.stored_bodies) < 2000:
                self.stored_bodies.append(body)


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    tally: Tally = field(default_factory=Tally)


@dataclass
class Run:
    """One measured run against one server."""

    server: str
    kind: str  # closed | duplicates | open
    seconds: float
    # Closed loop: of the requests answered within the measured seconds. Open loop: of every request
    # due within them, however late its answer came.
    latencies: list[float]
    cpu: Cpu
    rate: float | None = None  # the open loop's offered rate
    lag: float = 0.0  # open loop: how late the generator sent, at its worst (seconds)
    answered: int | None = None  # open loop: answers that came within the measured seconds

    @property
    def throughput(self) -> float:
        """Answers per second within the measured seconds."""
        return (len(self.latencies) if self.answered is None else self.answered) / self.seconds

    @property
    def cost(self) -> float:
        """The server's CPU seconds per answered request."""
        return self.cpu.server / self.throughput if self.throughput else float("nan")

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def busy_seconds() -> float:
    """CPU time the whole machine spent busy (all cores), from /proc/stat."""
    fields = [int(each) for each in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None = None) -> float:
    """User+system CPU time of a process (all its threads), from /proc."""
    stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


async def send(
    session: aiohttp.ClientSession, server: Server, body: bytes, fingerprints: Sequence[str]
) -> bool:
    """POST one delivery; whether it was answered (with any status)."""
    try:
        async with session.post(server.url + PATH, data=body, headers=HEADERS) as response:
            text = await response.read()
            server.tally.answered(response.status, text, fingerprints, body)
            return True
    except (aiohttp.ClientError, TimeoutError) as exc:
        server.tally.errors[type(exc).__name__] += 1
        return False


@dataclass
class Cpu:
    """Shares of one core over a run's measured seconds."""

    server: float = 0.0  # the server under test
    client: float = 0.0  # the load generator (this process)
    idle: float = 0.0  # the other server, not under load (specguard may still act on alerts)
    others: float = 0.0  # every other process on the machine


class Window:
    """The measured seconds of a run, with the CPU each process used in them."""

    def __init__(self, server: Server, idle: Server, warmup: float, seconds: float) -> None:
        self.server, self.idle, self.seconds = server, idle, seconds
        self.start = time.perf_counter() + warmup
        self.end = self.start + seconds
        self.cpu = Cpu()
        self._task = asyncio.create_task(self._measure())

    def _sample(self) -> tuple[float, float, float, float]:
        return (
            cpu_seconds(self.server.process.pid),
            cpu_seconds(),
            cpu_seconds(self.idle.process.pid),
            busy_seconds(),
        )

    async def _measure(self) -> None:
        await asyncio.sleep(max(0.0, self.start - time.perf_counter()))
        before = self._sample()
        await asyncio.sleep(max(0.0, self.end - time.perf_counter()))
        server, client, idle, machine = (
            (b - a) / self.seconds for a, b in zip(before, self._sample(), strict=True)
        )
        self.cpu = Cpu(server, client, idle, max(0.0, machine - server - client - idle))

    def inside(self, moment: float) -> bool:
        return self.start <= moment <= self.end

    async def done(self) -> Cpu:
        await self._task
        return self.cpu


def session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=False),
        timeout=aiohttp.ClientTimeout(total=30),
    )


async def closed_loop(
    server: Server,
    idle: Server,
    next_body: Callable[[], tuple[bytes, tuple[str, ...]]],
    concurrency: int,
    warmup: float,
    seconds: float,
    kind: str = "closed",
) -> Run:
    latencies: list[float] = []
    async with session(concurrency) as client:
        window = Window(server, idle, warmup, seconds)

        async def worker() -> None:
            while time.perf_counter() < window.end:
                body, fingerprints = next_body()
                sent = time.perf_counter()
                ok = await send(client, server, body, fingerprints)
                finished = time.perf_counter()
                if ok and window.inside(finished):
                    latencies.append(finished - sent)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu = await window.done()
    return Run(server.name, kind, seconds, latencies, cpu)


async def open_loop(
    server: Server, idle: Server, payloads: Payloads, rate: float, warmup: float, seconds: float
) -> Run:
    latencies: list[float] = []
    lag = 0.0
    answered = 0
    async with session(OPEN_CONNECTIONS) as client:
        window = Window(server, idle, warmup, seconds)
        first = time.perf_counter()
        tasks: set[asyncio.Task[None]] = set()

        async def one(due: float) -> None:
            nonlocal answered
            body, fingerprints = payloads.make()
            if not await send(client, server, body, fingerprints):
                return
            finished = time.perf_counter()
            if window.inside(finished):
                answered += 1
            if window.inside(due):  # however late the answer: a stall must not be left out
                latencies.append(finished - due)  # from when it was due: a late send counts

        for i in range(int((warmup + seconds) * rate)):
            due = first + i / rate
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            lag = max(lag, time.perf_counter() - due)
            task = asyncio.create_task(one(due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(set(tasks))
        cpu = await window.done()
    return Run(server.name, "open", seconds, latencies, cpu, rate, lag, answered)
