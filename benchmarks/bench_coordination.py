"""The cost of a fleet slot: ``acquire`` and ``release`` of the ``restarts`` semaphore (limit 2)
against the store's own round trip, measured in the same run, on a real etcd and a real Redis
started here on loopback (the Debian packages).

The round trip is the cheapest request through the same client: Redis's PING (redis-py's asyncio
client), etcd's range of one key (etcd3gw, from the same thread pool the Coordinator uses).

Contenders are Coordinators in this process on one event loop, each with a client of its own, as
hosts would have. One contender: it acquires and releases, over and over, a round trip taken
before each pair. 64 and 1,000: waves, as when every host sees the same incident at once: all
acquire together, the granted release together, then round trips alone before the next wave. The
etcd contenders share one pool of 8 threads for etcd3gw's blocking calls (2 cores here), so a
call's time includes its wait for a thread, as the Redis calls' includes the event loop's queue.

Result: p50 and p99 of each, in milliseconds and as multiples of the round trip's, and the share of
acquires granted, refused (slots full), and given up on contention (etcd: the guard key changed
under every attempt) or failed. Run:
    .venv/bin/python benchmarks/bench_coordination.py [--write benchmarks/results/coordination.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from etcd3gw.client import Etcd3Client
from ports import free_ports
from redis.asyncio import Redis

from specguard.coordination.base import RESTARTS, Coordinator, Grant, Unavailable
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.etcd_store import ATTEMPTS, EtcdCoordinator
from specguard.coordination.opening import open_coordinator

LIMIT = 2
TTL = 30.0
TIMEOUT = 60.0  # a benchmark measures slow calls instead of cutting them off
THREADS = 8
# (contenders, waves): about 3000 acquires for each size but the first
PLAN = ((1, 1500), (64, 40), (1000, 3))
RTT_PER_WAVE = 50


@dataclass
class Sample:
    rtt: list[float] = field(default_factory=list)
    acquire: list[float] = field(default_factory=list)
    release: list[float] = field(default_factory=list)
    waves: list[float] = field(default_factory=list)  # from a wave's start until every acquire answered
    outcomes: Counter[str] = field(default_factory=Counter)
    conflicts: int = 0  # etcd transactions that lost to another grant (then tried again)


class CountingEtcd(EtcdCoordinator):
    """Counts the granting transactions that found the guard changed."""

    conflicts = 0
    _lock = threading.Lock()

    def _txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> dict[str, Any]:
        answer = super()._txn(compare, success)
        if not answer.get("succeeded") and any(c.get("target") == "MOD" for c in compare):
            with CountingEtcd._lock:
                CountingEtcd.conflicts += 1
        return answer


@contextmanager
def server(command: list[str], ready: Callable[[], bool], log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{command[0]} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


def etcd_ready(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    return ready


def redis_ready(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    return ready


async def timed(call: Awaitable[Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    try:
        answer = await call
    except Unavailable as exc:
        answer = exc
    return (time.perf_counter() - started) * 1000, answer


def outcome(answer: Any) -> str:
    if isinstance(answer, Unavailable):
        return "failed"
    assert isinstance(answer, Grant)
    if answer.granted:
        return "granted"
    return "contended" if answer.why.startswith("contended") else "refused"


class Store:
    """One store: how to open contenders on it and how to take its round trip."""

    def __init__(self, name: Literal["etcd", "redis"], url: str, executor: ThreadPoolExecutor) -> None:
        self.name, self.url, self.executor = name, url, executor

    def open(self, prefix: str) -> Coordinator:
        config = CoordinationConfig(store=self.name, url=self.url, prefix=prefix, timeout=TIMEOUT)
        if self.name == "redis":
            return open_coordinator(config)
        port = int(self.url.rsplit(":", 1)[1])
        client = Etcd3Client(host="127.0.0.1", port=port, timeout=TIMEOUT, api_path="/v3/")
        return CountingEtcd(client, f"127.0.0.1:{port}", prefix, TIMEOUT, executor=self.executor)

    async def round_trip(self) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
        """The round trip's call, and how to close its client."""
        if self.name == "redis":
            client = Redis.from_url(self.url)
            return client.ping, client.aclose
        port = int(self.url.rsplit(":", 1)[1])
        etcd = Etcd3Client(host="127.0.0.1", port=port, timeout=TIMEOUT, api_path="/v3/")
        etcd.put("bench/rtt", "x")
        loop = asyncio.get_running_loop()

        async def close() -> None:
            etcd.session.close()

        return (lambda: loop.run_in_executor(self.executor, etcd.get, "bench/rtt")), close


async def measure(store: Store, contenders: int, waves: int) -> Sample:
    sample = Sample()
    prefix = f"bench-{contenders}/"
    clients = [store.open(prefix) for _ in range(contenders)]
    ping, close = await store.round_trip()
    owners = [f"host-{i}:vllm_restart" for i in range(contenders)]
    # Connections made (and Lua scripts loaded) before anything is timed.
    await asyncio.gather(*(c.holds(RESTARTS, o, 1) for c, o in zip(clients, owners, strict=True)))
    for _ in range(20):
        await ping()
    CountingEtcd.conflicts = 0
    for _ in range(waves):
        rtts = 1 if contenders == 1 else RTT_PER_WAVE
        for _ in range(rtts):
            took, _ = await timed(ping())
            sample.rtt.append(took)
        wave = time.perf_counter()
        answers = await asyncio.gather(
            *(
                timed(c.acquire(RESTARTS, o, LIMIT, TTL, "bench"))
                for c, o in zip(clients, owners, strict=True)
            )
        )
        sample.waves.append((time.perf_counter() - wave) * 1000)
        releases = []
        for (took, answer), c, o in zip(answers, clients, owners, strict=True):
            sample.acquire.append(took)
            sample.outcomes[outcome(answer)] += 1
            if isinstance(answer, Grant) and answer.token is not None:
                releases.append(timed(c.release(RESTARTS, o, answer.token)))
        for took, released in await asyncio.gather(*releases):
            sample.release.append(took)
            assert released is True, released
    sample.conflicts = CountingEtcd.conflicts
    for c in clients:
        await c.close()
    await close()
    return sample


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(store: str, contenders: int, s: Sample) -> str:
    rtt50, rtt99 = pct(s.rtt, 0.5), pct(s.rtt, 0.99)
    a50, a99, r50, r99 = pct(s.acquire, 0.5), pct(s.acquire, 0.99), pct(s.release, 0.5), pct(s.release, 0.99)
    total = sum(s.outcomes.values())
    share = {k: f"{100 * s.outcomes[k] / total:.1f} %" for k in ("granted", "refused", "contended", "failed")}
    conflicts = f"{s.conflicts} ({100 * s.conflicts / total:.1f} %)" if store == "etcd" else "-"
    wave = (
        f"{statistics.median(s.waves):.0f} ({statistics.median(s.waves) / contenders:.2f})"
        if contenders > 1
        else "-"
    )
    return (
        f"| {store} | {contenders} | {total} | {rtt50:.3f} / {rtt99:.3f} | {wave} "
        f"| {a50:.3f} / {a99:.3f} | {a50 / rtt50:.1f}x / {a99 / rtt99:.1f}x "
        f"| {r50:.3f} / {r99:.3f} | {r50 / rtt50:.1f}x / {r99 / rtt99:.1f}x "
        f"| {share['granted']} | {share['refused']} | {share['contended']} | {conflicts} | {share['failed']} |"
    )


def versions(etcd: str, redis: str) -> str:
    def first(command: list[str]) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout.splitlines()[0]

    from importlib.metadata import version

    return (
        f"{first([etcd, '--version'])}, {first([redis, '--version']).split(' sha=')[0]}; "
        f"etcd3gw {version('etcd3gw')}, redis-py {version('redis')}; Python {platform.python_version()}"
    )


async def run_all(etcd_url: str, redis_url: str) -> list[str]:
    rows = []
    with ThreadPoolExecutor(THREADS, thread_name_prefix="etcd") as executor:
        stores: tuple[tuple[Literal["etcd", "redis"], str], ...] = (("etcd", etcd_url), ("redis", redis_url))
        for name, url in stores:
            store = Store(name, url, executor)
            for contenders, waves in PLAN:
                started = time.monotonic()
                sample = await measure(store, contenders, waves)
                rows.append(row(name, contenders, sample))
                print(f"{rows[-1]}  ({time.monotonic() - started:.1f} s)", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="write the results (Markdown) to this file")
    args = parser.parse_args()
    etcd, redis = shutil.which("etcd"), shutil.which("redis-server")
    if etcd is None or redis is None:
        sys.exit("needs etcd (apt-get install etcd-server) and redis-server (apt-get install redis-server)")
    started, load = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ec, ep, rp = free_ports(3)
        etcd_url, peer = f"http://127.0.0.1:{ec}", f"http://127.0.0.1:{ep}"
        etcd_cmd = [
            etcd, "--name", "x", "--data-dir", str(d / "etcd"), "--listen-client-urls", etcd_url,
            "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer, "--initial-cluster", f"x={peer}", "--log-level", "warn",
            "--logger", "zap",
        ]  # fmt: skip
        redis_cmd = [redis, "--port", str(rp), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", str(d), "--maxclients", "4000"]  # fmt: skip
        with (
            server(etcd_cmd, etcd_ready(ec), d / "etcd.log"),
            server(redis_cmd, redis_ready(rp), d / "redis.log"),
        ):
            rows = asyncio.run(run_all(etcd_url, f"redis://127.0.0.1:{rp}/0"))
    took = time.monotonic() - started
    text = report(rows, versions(etcd, redis), took, load)
    print(text)
    if args.write:
        args.write.write_text(text)


def report(rows: list[str], versions: str, took: float, load: float) -> str:
    (_, rounds), *waves = PLAN
    plan = f"one contender: {rounds} rounds; " + "; ".join(f"{n}: {w} waves" for n, w in waves)
    return f"""# A fleet slot's cost: acquire and release against the store's round trip

{versions}. Both on loopback, started by the benchmark (etcd's data directory on the temp disk,
Redis without persistence); {platform.machine()}, {os.cpu_count()} cores shared with other work
(load average {load:.1f} at the start); {took:.0f} s in all.

The `restarts` semaphore with a limit of 2 and a 30 s lease, no budget; the contenders are
Coordinators in one process on one event loop, each with its own client (etcd: one pool of
{THREADS} threads for etcd3gw's blocking calls, shared). One contender acquires and releases in
turn; 64 and 1,000 come in waves: all acquire at once, the granted release at once ({plan}).
The round trip (rtt): Redis PING through redis-py; etcd, a range of one key through etcd3gw on
the same threads; {RTT_PER_WAVE} before each wave (one before each acquire for one contender).
Times in milliseconds, p50 / p99, and as multiples of the round trip's p50 / p99. "wave": the
median time from a wave's start until all its acquires have answered, and that divided by the
contenders. A wave's acquire waits its turn (on the one event loop and in Redis's queue, or for
one of the {THREADS} threads and etcd's transactions), so its time grows with the wave while the
round trip's does not: the multiples for waves measure queueing, the time per acquire the cost.

| store | contenders | acquires | rtt ms | wave ms (per acquire) | acquire ms | acquire / rtt | release ms | release / rtt | granted | refused (full) | given up (contended) | etcd txn conflicts | failed |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

An acquire on Redis is one script (one round trip); on etcd, a range of the semaphore's keys, then,
when a slot is free, a lease grant and the transaction (three round trips, the transaction written
to etcd's log), and only the range when the slots are full, which is what most of a wave's acquires
find. A release: one script; on etcd, the transaction deleting the holder's key, then the lease's
revocation. Conflicts are granting transactions that found the guard key changed (another grant
came first) and read again; "given up" counts acquires refused after {ATTEMPTS} of them in a row.
"""


if __name__ == "__main__":
    main()
