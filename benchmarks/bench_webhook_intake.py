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
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/ is not an installed package; its payload builders are used here
from tests.am_payloads import alert, message  # noqa: E402

TOKEN = "bench-webhook-token"
PATH = "/alertmanager"
RATIO_TARGET = 0.5  # specguard's throughput over the bare handler's, at least
P99_TARGET = 0.020  # seconds, at the open-loop rate
IDLE_TIMEOUT = 10.0  # daemon/server.py's keep-alive, for the bare server too
OPEN_CONNECTIONS = 64  # connections the open loop may use at most
# specguard waits up to 20 s for a round in progress and 5 s for the HTTP server when it stops.
STOP_TIMEOUT = 30.0


# --- the bare server (run in its own process: this file with --serve-bare PORT) -----------------


async def serve_bare(port: int) -> None:
    async def receive(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "ok"})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=2**20)
    app.router.add_post(PATH, receive)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=5.0, keepalive_timeout=IDLE_TIMEOUT
    )
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


# --- the load ------------------------------------------------------------------------------------


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


# --- the servers ---------------------------------------------------------------------------------


def write_specguard_config(directory: Path, port: int, unused_port: int) -> Path:
    (directory / "token").write_text(TOKEN + "\n")
    (directory / "rules.yaml").write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "name": "bench_alerts",
                        "alert": {"match": {"alertname": "Bench"}},
                        "severity": "info",  # the log action then logs at info, below the log level
                        "actions": ["log"],
                    }
                ]
            }
        )
    )
    config = directory / "specguard.yaml"
    config.write_text(
        json.dumps(
            {
                "server": {"port": port, "webhook_token_file": "token"},
                "state_dir": "state",
                "log_level": "warning",
                "rules": ["rules.yaml"],
                "sources": {"scrape": {"targets": [f"http://127.0.0.1:{unused_port}/metrics"]}},
            }
        )
    )
    return config


async def wait_listening(server: Server, log: Path | None) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                said = log.read_text()[-3000:] if log else ""
                raise SystemExit(f"{server.name} exited with {server.process.returncode}\n{said}")
            try:
                async with client.get(server.url + "/healthz") as response:
                    await response.read()
                    return
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.05)
    raise SystemExit(f"{server.name} did not listen within 30 s")


def stop(server: Server) -> tuple[int | None, float]:
    """SIGTERM; the exit code (None: it had not exited after STOP_TIMEOUT and was killed) and how
    long it took."""
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout=STOP_TIMEOUT), time.monotonic() - started
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@dataclass
class StoreCheck:
    deliveries: int
    receipts: int
    unprocessed: int  # receipts not yet acted on when specguard stopped
    missing_deliveries: int  # answered 2xx, not in the store: lost
    missing_receipts: int  # new alerts of a delivery answered "stored", not in the store: lost
    extra_deliveries: int  # in the store without a 2xx answer (the client gave up on it)
    series: int  # series_state rows: the alert rule's series
    events: int
    runs: dict[str, int]  # action runs by status
    exit_code: int | None  # None: killed, it had not exited
    stop_seconds: float
    log_problems: list[str]  # warnings and errors in the log

    @property
    def lost(self) -> bool:
        return self.missing_deliveries > 0 or self.missing_receipts > 0


def check_store(database: Path, tally: Tally, stopped: tuple[int | None, float], log: Path) -> StoreCheck:
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        ids = {row[0] for row in db.execute("SELECT id FROM deliveries")}
        fingerprints = {row[0] for row in db.execute("SELECT fingerprint FROM alert_receipts")}
        (receipts,) = db.execute("SELECT COUNT(*) FROM alert_receipts").fetchone()
        (unprocessed,) = db.execute("SELECT COUNT(*) FROM alert_receipts WHERE processed IS NULL").fetchone()
        (series,) = db.execute("SELECT COUNT(*) FROM series_state").fetchone()
        (events,) = db.execute("SELECT COUNT(*) FROM events").fetchone()
        runs = dict(db.execute("SELECT status, COUNT(*) FROM action_runs GROUP BY status").fetchall())
    finally:
        db.close()
    problems = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(line[:200])
            continue
        if record.get("level") in ("warning", "error", "critical"):
            problems.append(str(record.get("msg", ""))[:200])
    return StoreCheck(
        deliveries=len(ids),
        receipts=int(receipts),
        unprocessed=int(unprocessed),
        missing_deliveries=len(tally.deliveries - ids),
        missing_receipts=len(tally.stored_fingerprints - fingerprints),
        extra_deliveries=len(ids - tally.deliveries),
        series=int(series),
        events=int(events),
        runs={str(status): int(count) for status, count in runs.items()},
        exit_code=stopped[0],
        stop_seconds=stopped[1],
        log_problems=problems,
    )


# --- the benchmark -------------------------------------------------------------------------------


@dataclass
class Results:
    closed: list[Run]
    duplicates: Run | None
    opened: list[Run]
    rate: float
    rate_from: str
    payload_size: int
    bare: Tally
    specguard: Tally
    store: StoreCheck
    revision: str
    guard_cpu: float  # CPU seconds specguard used from its start to the SIGTERM
    guard_seconds: float  # and the seconds it ran


def median_of(runs: Sequence[Run], server: str, metric: Callable[[Run], float]) -> float:
    return statistics.median(metric(run) for run in runs if run.server == server)


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


def say(what: str, run: Run) -> None:
    print(
        f"{what}, {run.server}: {run.throughput:.0f} answered/s, p50 {ms(run.percentile(0.5))}, "
        f"p99 {ms(run.percentile(0.99))}, max {ms(max(run.latencies, default=0.0))}; CPU: server "
        f"{run.cpu.server:.0%}, load generator {run.cpu.client:.0%}, idle server {run.cpu.idle:.0%}, "
        f"others {run.cpu.others:.0%}" + (f"; sent late by {ms(run.lag)} at most" if run.rate else ""),
        flush=True,
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def yes(value: bool) -> str:
    return "yes" if value else "**NO**"


def report(results: Results, args: argparse.Namespace) -> tuple[str, bool]:
    closed, opened, store, guard = results.closed, results.opened, results.store, results.specguard

    def med(runs: Sequence[Run], server: str, metric: Callable[[Run], float]) -> float:
        return median_of(runs, server, metric)

    def each(runs: Sequence[Run], server: str, show: Callable[[Run], str]) -> str:
        return ", ".join(show(run) for run in runs if run.server == server)

    def pct(value: float) -> str:
        return f"{value:.0%}"

    ratio = med(closed, "specguard", lambda r: r.throughput) / med(closed, "bare", lambda r: r.throughput)
    open_p99 = med(opened, "specguard", lambda r: r.percentile(0.99))
    non_2xx = {status: count for status, count in guard.statuses.items() if not 200 <= status < 300}
    answered = sum(guard.statuses.values())
    lines = [
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}. The "
        f"server under test and the load generator (aiohttp's client, the benchmark's process) each run "
        f"in their own process and share the cores with the other server and whatever else runs on the "
        f"machine (the CPU of each is shown). Each request: a version 4 payload of "
        f"{results.payload_size} bytes with 2 alerts whose labels and fingerprints no other request "
        f"has, so every delivery is new and is stored before it is answered; "
        + (
            "every alert is one the alert rule takes (alertname Bench): each fires a new series of "
            "it and runs its action, the worst case; "
            if args.acted_on
            else "the alerts are ones no rule takes (alertname Load): stored and acted on by no rule; "
        )
        + f"a bearer token; keep-alive "
        f"connections. specguard: `specguard run` with one alert rule (`alert: {{match: {{alertname: "
        f"Bench}}}}`, severity info, action log), log level warning, its store (SQLite, WAL, "
        f"synchronous=FULL) on {fs_type(Path(tempfile.gettempdir()))}. Bare: an aiohttp handler that "
        f"reads the body and answers 200 without storing it, same server settings. specguard at "
        f"{results.revision}.",
        "",
        f"Closed loop: {args.concurrency} concurrent workers, {args.warmup:g} s warm-up then "
        f"{args.seconds:g} s measured, {args.rounds} rounds alternating bare and specguard; medians of "
        f"the rounds, each round in parentheses. CPU: share of one core over the measured seconds; "
        f'"idle server" is the other server, not under load at the time.',
        "",
        "| server | requests/s | p50 | p99 | server CPU | server CPU per request | load generator CPU | idle server CPU | other processes' CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("bare", "bare aiohttp, 200 without storing"),
        ("specguard", "specguard, new deliveries"),
    ):
        lines.append(
            f"| {label} | {med(closed, name, lambda r: r.throughput):.0f} "
            f"({each(closed, name, lambda r: f'{r.throughput:.0f}')}) | "
            f"{ms(med(closed, name, lambda r: r.percentile(0.5)))} | "
            f"{ms(med(closed, name, lambda r: r.percentile(0.99)))} "
            f"({each(closed, name, lambda r: ms(r.percentile(0.99)))}) | "
            f"{pct(med(closed, name, lambda r: r.cpu.server))} | "
            f"{us(med(closed, name, lambda r: r.cost))} ({each(closed, name, lambda r: us(r.cost))}) | "
            f"{pct(med(closed, name, lambda r: r.cpu.client))} | "
            f"{pct(med(closed, name, lambda r: r.cpu.idle))} ({each(closed, name, lambda r: pct(r.cpu.idle))}) | "
            f"{pct(med(closed, name, lambda r: r.cpu.others))} |"
        )
    dup = results.duplicates
    if dup is not None:
        lines.append(
            f"| specguard, repeated deliveries (all duplicates; one run of {dup.seconds:g} s) | "
            f"{dup.throughput:.0f} | {ms(dup.percentile(0.5))} | {ms(dup.percentile(0.99))} | "
            f"{pct(dup.cpu.server)} | {us(dup.cost)} | {pct(dup.cpu.client)} | {pct(dup.cpu.idle)} | "
            f"{pct(dup.cpu.others)} |"
        )
    all_in = results.guard_cpu / answered if answered else float("nan")
    lines += [
        "",
        f"Throughput ratio specguard / bare (closed-loop medians): **{ratio:.2f}** "
        f"(target: at least {RATIO_TARGET:g}). Server CPU per request, specguard / bare: "
        f"{med(closed, 'specguard', lambda r: r.cost) / med(closed, 'bare', lambda r: r.cost):.1f}. "
        f"specguard's CPU over its whole life ({results.guard_cpu:.0f} s in {results.guard_seconds:.0f} s, "
        f"warm-ups, idle turns and work left over after each run included) per request it answered: "
        f"{us(all_in)}.",
        *notes(closed),
        "",
        f"Open loop: requests sent at **{results.rate:.0f} req/s** ({results.rate_from}) whatever the "
        f"answers do, on up to {OPEN_CONNECTIONS} connections, {args.warmup:g} s warm-up then "
        f"{args.open_seconds:g} s measured, {args.rounds} rounds alternating; latency of every request "
        f"due in the measured seconds, counted from the moment it was due, however late its answer "
        f"came. The last column is how late the generator itself sent, at worst.",
        "",
        "| server | answered/s | p50 | p99 | max | server CPU | idle server CPU | other processes' CPU | sent late by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("bare", "specguard"):
        lines.append(
            f"| {name} | {med(opened, name, lambda r: r.throughput):.0f} | "
            f"{ms(med(opened, name, lambda r: r.percentile(0.5)))} | "
            f"{ms(med(opened, name, lambda r: r.percentile(0.99)))} "
            f"({each(opened, name, lambda r: ms(r.percentile(0.99)))}) | "
            f"{ms(med(opened, name, lambda r: max(r.latencies, default=0.0)))} "
            f"({each(opened, name, lambda r: ms(max(r.latencies, default=0.0)))}) | "
            f"{pct(med(opened, name, lambda r: r.cpu.server))} | {pct(med(opened, name, lambda r: r.cpu.idle))} | "
            f"{pct(med(opened, name, lambda r: r.cpu.others))} | "
            f"{ms(max(r.lag for r in opened if r.server == name))} |"
        )
    outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(guard.outcomes.items()))
    runs = ", ".join(f"{count} {status}" for status, count in sorted(store.runs.items())) or "none"
    stop_text = (
        f"{store.stop_seconds:.1f} s, exit code {store.exit_code}"
        if store.exit_code is not None
        else f"**had not exited after {store.stop_seconds:.0f} s: killed**"
    )
    lines += [
        "",
        "What specguard answered over the whole benchmark (warm-ups included), and what its store held "
        "after it stopped:",
        "",
        "| | count |",
        "|---|---|",
        f"| requests answered 2xx | {guard.ok} ({outcomes}) |",
        f"| answered otherwise | {sum(non_2xx.values())}"
        + "".join(
            f"; {status}: {count} ({guard.reasons.get(status, '')!r})"
            for status, count in sorted(non_2xx.items())
        )
        + " |",
        f"| no answer (client errors) | {sum(guard.errors.values())}"
        + "".join(f"; {name}: {count}" for name, count in sorted(guard.errors.items()))
        + " |",
        f"| rows in `deliveries` | {store.deliveries} (one per 2xx answer) |",
        f"| rows in `alert_receipts` | {store.receipts} (the 2xx answers said {guard.new_alerts} new) |",
        f"| **deliveries answered 2xx, not in the store (lost)** | {store.missing_deliveries} |",
        f'| **alerts answered "stored", not in the store (lost)** | {store.missing_receipts} |',
        f"| deliveries in the store without a 2xx answer | {store.extra_deliveries} |",
        f"| alert receipts not yet acted on when specguard stopped | {store.unprocessed} |",
        f"| the alert rule's series / events / action runs | {store.series} / {store.events} / {runs} |",
        f"| SIGTERM to exit | {stop_text} |",
        f"| warnings and errors in specguard's log | {len(store.log_problems)} |",
        "",
        "Targets:",
        "",
        f"- throughput at least {RATIO_TARGET:g} x bare: {yes(ratio >= RATIO_TARGET)} ({ratio:.2f})",
        f"- p99 at most {ms(P99_TARGET)} at {results.rate:.0f} req/s: {yes(open_p99 <= P99_TARGET)} "
        f"({ms(open_p99)})",
        f"- every 2xx stored, none lost: {yes(not store.lost)}",
        f"- every request answered 2xx: {yes(not non_2xx and not guard.errors)}",
    ]
    said = Counter(store.log_problems)
    if said:
        lines += ["", "specguard's log, warnings and errors:", ""]
        lines += [f"- {count} x {message}" for message, count in said.most_common(10)]
    return "\n".join(lines), not store.lost


def notes(closed: Sequence[Run]) -> list[str]:
    """What disturbed the measurement, when something did."""
    out = []
    client = median_of(closed, "bare", lambda r: r.cpu.client)
    server = median_of(closed, "bare", lambda r: r.cpu.server)
    if client >= 0.75 and client > server:
        out += [
            "",
            f"The load generator used {client:.0%} of a core against the bare server (which used "
            f"{server:.0%}): the bare throughput is bounded by the generator as much as by the server, "
            f"so the ratio flatters specguard.",
        ]
    idle = median_of(closed, "bare", lambda r: r.cpu.idle)
    if idle >= 0.1:
        out += [
            "",
            f"specguard, the idle server during the bare runs, still used {idle:.0%} of a core (median) "
            f"acting on the alerts it had taken in: that CPU was taken from the bare runs, so the ratio "
            f"flatters specguard, and the work is part of what each delivery costs it.",
        ]
    others = max(run.cpu.others for run in closed)
    if others >= 0.2:
        out += [
            "",
            f"Other processes used up to {others:.0%} of a core during the closed-loop runs: the "
            f"machine was shared, which is why the rounds alternate.",
        ]
    return out


def revision() -> str:
    """The commit the daemon ran from, and whether its code had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "daemon", "rules", "actions"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown revision"
    return f"commit {head}" + (" with uncommitted changes to its code" if dirty else "")


def fs_type(path: Path) -> str:
    """The file system type of ``path`` (from /proc/mounts), for the table."""
    best, kind = "", "?"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


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
