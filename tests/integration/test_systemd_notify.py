"""`specguard run` under the sd_notify protocol, as systemd runs a Type=notify unit with a watchdog:
a real AF_UNIX datagram socket in $NOTIFY_SOCKET, WATCHDOG_USEC set, the daemon in its own process.

READY=1 must mean serving and judging. The source here is a Prometheus that takes half a second per
query, so the first round of the shipped pack's six rules takes seconds: a READY=1 sent before it
(or before the HTTP server listens) is caught by the look the socket's reader takes at /api/status
the moment READY=1 arrives.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.notify_socket import notify_socket
from tests.ports import free_port
from tests.processes import Daemon

QUERY_DELAY = 0.5
WATCHDOG_USEC = 400_000  # pings every 0.2 s


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
        assert len({r["rule"] for r in rules}) == 7
        assert all(r["verdict"] is not None for r in rules), [(r["rule"], r["verdict"]) for r in rules]
        assert ready.fields["STATUS"].startswith("7 rules; ")
        assert "\n" not in ready.fields["STATUS"]

        # Watchdog: from before READY on, at half of WATCHDOG_USEC.
        await asyncio.to_thread(_wait_pings, sock, after=ready.monotonic, count=8, timeout=30)
        pings = [m.monotonic for m in sock.having("WATCHDOG=1")]
        assert pings[0] < ready.monotonic
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert statistics.median(gaps) < WATCHDOG_USEC / 1e6  # well inside the watchdog's limit

        # SIGHUP: RELOADING=1 (with the time systemd 253+ needs), then READY=1 again.
        mark = len(sock.messages)
        daemon.signal(signal.SIGHUP)
        reloading = await asyncio.to_thread(sock.wait_for, "RELOADING=1", 30, mark)
        assert int(reloading.fields["MONOTONIC_USEC"]) > 0
        again = await asyncio.to_thread(sock.wait_for, "READY=1", 30, sock.messages.index(reloading) + 1)
        assert again.monotonic > reloading.monotonic
        assert again.fields["STATUS"].startswith("7 rules; ")

        # SIGTERM: STOPPING=1, then a clean exit.
        mark = len(sock.messages)
        assert await asyncio.to_thread(daemon.stop, signal.SIGTERM) == 0  # the loop serves Prometheus
        stopping = await asyncio.to_thread(sock.wait_for, "STOPPING=1", 10, mark)
        assert stopping.fields.get("STATUS") == "stopping"
        told = [m for m in sock.messages if "WATCHDOG" not in m.fields]
        assert told[-1] is stopping  # nothing after it but pings (systemd 259+ takes it as final)


def _wait_pings(sock: Any, after: float, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([m for m in sock.having("WATCHDOG=1") if m.monotonic > after]) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} watchdog pings within {timeout} s")
