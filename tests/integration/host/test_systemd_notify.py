"""`specguard run` under the sd_notify protocol, as systemd runs a Type=notify unit with a watchdog:
a real AF_UNIX datagram socket in $NOTIFY_SOCKET, WATCHDOG_USEC set, the daemon in its own process.

READY=1 must mean serving and judging. The source here is a Prometheus that takes half a second per
query, so the first round of the shipped pack's eight rules takes seconds: a READY=1 sent before it
(or before the HTTP server listens) is caught by the look the socket's reader takes at /api/status
the moment READY=1 arrives.

The order of the messages is forced where it matters, never left to timing: a Prometheus that holds
the first round until the test lets it go (a SIGHUP during the start-up), and, in-process, a reload
held in the middle of reading its config and a round held in the middle of a query while the daemon
stops.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.config.loading import load
from specguard.daemon import reload, runtime, self_status
from specguard.rules.signals import Signal
from specguard.sources.base import SourceResult
from tests.notify_socket import NotifySocket, notify_socket
from tests.ports import free_port
from tests.processes import Daemon

QUERY_DELAY = 0.5
# Pings every 0.5 s. The gaps are checked against the protocol's half of WATCHDOG_USEC within
# [0.35, 0.7] of it: an idle loop is late by milliseconds, so the 200 ms left above the interval
# absorb a loaded machine, and only the reader thread's jitter could shorten a gap below it.
WATCHDOG_USEC = 1_000_000


async def slow_prometheus(aiohttp_server: AiohttpServer) -> str:
    async def query(_: web.Request) -> web.Response:
        await asyncio.sleep(QUERY_DELAY)
        sample = {"metric": {"instance": "vllm-a:8000", "model_name": "m"}, "value": [time.time(), "0.8"]}
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [sample]}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


def status_now(port: int) -> Any:
    """/api/status, asked from the socket's reader thread the moment READY=1 arrives."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as answer:
            return json.load(answer)
    except OSError as exc:
        return f"not answering: {exc}"


async def test_ready_status_watchdog_reload_and_stop_follow_the_protocol(
    tmp_path: Path, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    prometheus = await slow_prometheus(aiohttp_server)
    port = free_port()
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1h\n"
        f"sources: {{prometheus: {{url: {prometheus}, timeout: 10s}}}}\nrules: [builtin:speculative]\n"
    )
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemons.append(daemon)
    with notify_socket(tmp_path) as sock:
        sock.on_message = lambda fields: status_now(port) if fields.get("READY") == "1" else None
        env = {**os.environ, "NOTIFY_SOCKET": sock.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
        env.pop("WATCHDOG_PID", None)
        daemon.start(env=env)
        ready = await asyncio.to_thread(sock.wait_for, "READY=1", 60)

        # Serving (the HTTP server answered at once) and judging (every rule has a verdict).
        assert isinstance(ready.seen, dict), ready.seen
        rules = ready.seen["rules"]
        assert len({r["rule"] for r in rules}) == 8
        assert all(r["verdict"] is not None for r in rules), [(r["rule"], r["verdict"]) for r in rules]
        assert ready.fields["STATUS"].startswith("8 rules; ")
        assert "\n" not in ready.fields["STATUS"]

        # Watchdog: from before READY on, at half of WATCHDOG_USEC (the median of a dozen gaps, so
        # that one late wake-up of a loaded machine does not decide).
        await asyncio.to_thread(_wait_pings, sock, after=ready.monotonic, count=6, timeout=30)
        pings = [m.monotonic for m in sock.having("WATCHDOG=1")]
        assert pings[0] < ready.monotonic
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        limit = WATCHDOG_USEC / 1e6
        assert 0.35 * limit <= statistics.median(gaps) <= 0.7 * limit, gaps

        # SIGHUP: RELOADING=1 (with the time systemd 253+ needs), then READY=1 again.
        mark = len(sock.messages)
        daemon.signal(signal.SIGHUP)
        reloading = await asyncio.to_thread(sock.wait_for, "RELOADING=1", 30, mark)
        assert int(reloading.fields["MONOTONIC_USEC"]) > 0
        again = await asyncio.to_thread(sock.wait_for, "READY=1", 30, sock.messages.index(reloading) + 1)
        assert again.monotonic > reloading.monotonic
        assert again.fields["STATUS"].startswith("8 rules; ")

        # SIGTERM: STOPPING=1, then a clean exit.
        mark = len(sock.messages)
        assert await asyncio.to_thread(daemon.stop, signal.SIGTERM) == 0  # the loop serves Prometheus
        stopping = await asyncio.to_thread(sock.wait_for, "STOPPING=1", 10, mark)
        assert stopping.fields.get("STATUS") == "stopping"
        await asyncio.to_thread(_settled, sock)
    assert _after_stopping(sock) == []  # the last word (systemd 259+ takes it as final)


def _wait_pings(sock: Any, after: float, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([m for m in sock.having("WATCHDOG=1") if m.monotonic > after]) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} watchdog pings within {timeout} s")


def _settled(sock: NotifySocket) -> None:
    """Wait until the reader has taken every message sent so far: a marker sent now arrives after
    them (one socket, datagrams in order)."""
    marker = f"X_SETTLED={time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(marker.encode(), sock.address)
    sock.wait_for(marker, timeout=10)


def _after_stopping(sock: NotifySocket) -> list[dict[str, str]]:
    """What the daemon said after STOPPING=1 (the test's own markers left out)."""
    told = [m.fields for m in sock.messages if not any(key.startswith("X_") for key in m.fields)]
    stopping = [i for i, fields in enumerate(told) if fields.get("STOPPING") == "1"]
    assert len(stopping) == 1, told
    return told[stopping[0] + 1 :]


# --- a SIGHUP while systemd still waits for READY=1 ------------------------------------------------


async def held_prometheus(aiohttp_server: AiohttpServer) -> tuple[str, asyncio.Event, asyncio.Event]:
    """A Prometheus whose queries wait until ``release`` is set; ``asked`` is set by the first."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def query(_: web.Request) -> web.Response:
        asked.set()
        await release.wait()
        sample = {"metric": {"instance": "vllm-a:8000", "model_name": "m"}, "value": [time.time(), "0.8"]}
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [sample]}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}", asked, release


async def test_a_reload_asked_for_during_the_start_up_waits_for_ready(
    tmp_path: Path, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    prometheus, asked, release = await held_prometheus(aiohttp_server)
    port = free_port()
    config = tmp_path / "specguard.yaml"
    text = (
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1h\n"
        f"sources: {{prometheus: {{url: {prometheus}, timeout: 60s}}}}\nrules: [builtin:speculative]\n"
    )
    config.write_text(text)
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemons.append(daemon)
    with notify_socket(tmp_path) as sock:
        sock.on_message = lambda fields: status_now(port) if fields.get("READY") == "1" else None
        env = {**os.environ, "NOTIFY_SOCKET": sock.address}
        env.pop("WATCHDOG_USEC", None)
        daemon.start(env=env)
        # The first query is under way, so the signal handlers are in place (they come before
        # the schedule), and the first round cannot end before `release`.
        await asyncio.wait_for(asked.wait(), 60)
        config.write_text(text + "dry_run: true\n")  # what the reload is to take in
        daemon.signal(signal.SIGHUP)

        def taken() -> bool:
            said = [m for m in sock.messages if {"READY", "RELOADING"} & set(m.fields)]
            logged = any("during start-up" in line.get("msg", "") for line in daemon.logs())
            return bool(said) or logged

        deadline = time.monotonic() + 30
        while not taken():
            assert time.monotonic() < deadline, daemon.log.read_text()[-3000:]
            await asyncio.sleep(0.05)
        # The SIGHUP is taken, the first round is still held: systemd has heard nothing of a
        # reload, and no READY=1.
        assert [m.fields for m in sock.messages if {"READY", "RELOADING"} & set(m.fields)] == []
        released = time.monotonic()
        release.set()

        ready = await asyncio.to_thread(sock.wait_for, "READY=1", 60)
        assert ready.monotonic > released
        assert isinstance(ready.seen, dict), ready.seen
        assert all(r["verdict"] is not None for r in ready.seen["rules"])
        # Then the reload it was asked for, announced as a reload, on the config as it is now.
        reloading = await asyncio.to_thread(sock.wait_for, "RELOADING=1", 30, sock.messages.index(ready) + 1)
        await asyncio.to_thread(sock.wait_for, "READY=1", 30, sock.messages.index(reloading) + 1)
        status = await daemon.wait_for(lambda s: s["dry_run"] is True, timeout=30)
        assert len({r["rule"] for r in status["rules"]}) == 8
        assert await asyncio.to_thread(daemon.stop, signal.SIGTERM) == 0
        await asyncio.to_thread(_settled, sock)
    said = [sorted(m.fields) for m in sock.messages if {"READY", "RELOADING", "STOPPING"} & set(m.fields)]
    assert said == [
        ["READY", "STATUS"],
        ["MONOTONIC_USEC", "RELOADING", "STATUS"],
        ["READY", "STATUS"],
        ["STATUS", "STOPPING"],
    ]
    assert _after_stopping(sock) == []


# --- in-process: a stop while a reload or a round is in progress ---------------------------------


class HeldSource:
    """Answers ``value`` for every query; while ``gate`` is set, each query first waits for it."""

    kind = "scrape"

    def __init__(self, value: float):
        self.value = value
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()  # a query is waiting at the gate

    async def refresh(self) -> None:
        return None

    async def query_signal(self, signal: Signal, window: float, *_: object) -> SourceResult:
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        return SourceResult.of([({"instance": "h:1"}, self.value)])

    async def query_expr(self, expr: str) -> SourceResult:
        return SourceResult.failed("no raw PromQL here")

    async def close(self) -> None:
        return None


def one_rule(tmp_path: Path) -> Path:
    """One rule, firing below 0.5 at once; rounds only when the test asks (interval 1h)."""
    (tmp_path / "rules.yaml").write_text(
        'rules:\n  - {name: low, signal: acceptance_rate, condition: "< 0.5", window: 10s}\n'
    )
    path = tmp_path / "specguard.yaml"
    path.write_text("server: {port: 0}\nstate_dir: state\ninterval: 1h\nrules: [rules.yaml]\n")
    return path


@pytest.fixture
def notified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with notify_socket(tmp_path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
        monkeypatch.setenv("WATCHDOG_USEC", "200000")  # pings too: none may follow STOPPING=1
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        yield sock


async def test_a_stop_during_a_reload_is_the_last_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, notified: NotifySocket
) -> None:
    path = one_rule(tmp_path)
    daemon = runtime.Daemon(load(path), path)
    daemon.source = HeldSource(0.2)
    reading, held = threading.Event(), threading.Event()

    def held_load(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        held.wait(timeout=60)  # the reload is in the middle of reading its config
        return load(*args, **kwargs)

    monkeypatch.setattr(reload, "load", held_load)
    running = asyncio.ensure_future(daemon.run_until_stopped())
    try:
        await asyncio.to_thread(notified.wait_for, "READY=1", 30)
        os.kill(os.getpid(), signal.SIGHUP)  # as `systemctl reload` does
        await asyncio.to_thread(notified.wait_for, "RELOADING=1", 30)
        assert await asyncio.to_thread(reading.wait, 30)
        os.kill(os.getpid(), signal.SIGTERM)  # as `systemctl stop` does, mid-reload
        await asyncio.wait_for(asyncio.shield(running), 30)
    finally:
        held.set()
        if not running.done():
            daemon.request_stop()
            await running
    await asyncio.to_thread(_settled, notified)
    # The reload was cut short by the stop; its READY=1 would tell systemd the daemon runs again.
    assert _after_stopping(notified) == []


async def test_a_round_that_ends_during_the_stop_says_nothing_after_it(
    notified: NotifySocket, tmp_path: Path
) -> None:
    path = one_rule(tmp_path)
    daemon = runtime.Daemon(load(path), path)
    source = HeldSource(0.2)
    daemon.source = source
    running = asyncio.ensure_future(daemon.run_until_stopped())
    try:
        ready = await asyncio.to_thread(notified.wait_for, "READY=1", 30)
        assert ready.fields["STATUS"] == "1 rule; firing: low"
        # A round that will resolve the rule, held at its query.
        source.value, source.gate = 0.9, asyncio.Event()
        round_ = asyncio.ensure_future(daemon.evaluate_round())
        await asyncio.wait_for(source.waiting.wait(), 30)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.to_thread(notified.wait_for, "STOPPING=1", 30)
        source.gate.set()  # the stop waits for the round, which ends now
        await asyncio.wait_for(asyncio.shield(running), 30)
        await round_
    finally:
        if not running.done():
            daemon.request_stop()
            await running
    await asyncio.to_thread(_settled, notified)
    # The round did finish, and changed what STATUS= would say: the check below is not vacuous.
    assert [s.state.value for s in daemon.states["low"].values()] == ["resolved"]
    assert self_status.status_line(daemon) == "1 rule; none firing"
    assert _after_stopping(notified) == []
