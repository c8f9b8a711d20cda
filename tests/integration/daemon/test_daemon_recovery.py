"""`specguard run` killed, restarted, reloaded and starved, in its own process: on-call is paged once
per problem, a recorded action run is carried out once, and /healthz tells when rounds stop.

The vLLMs are local servers replaying a real vLLM 0.32.0 capture (acceptance 0.6 in every window);
one of them answers each scrape 1.5 s late, as a loaded server does.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.processes import Daemon
from tests.replay import ReplayedVllm

SLOW_SCRAPE = 1.5  # seconds the slow replayed vLLM takes to answer

RULES = """\
rules:
  - name: low
    signal: acceptance_rate
    window: 20s
    interval: 500ms
    condition: "{condition}"
    for: 1s
    no_data: ok
  - name: missing
    signal: acceptance_rate
    window: 20s
    interval: 500ms
    condition: "< 0.1"
    no_data: breach
"""


async def replayed(aiohttp_server: AiohttpServer, delay: float = 0.0) -> str:
    replay = ReplayedVllm()

    async def metrics(_: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(text=replay(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}/metrics"


def write_config(
    directory: Path, port: int, targets: list[str], condition: str = "< 0.7", extra: str = ""
) -> Path:
    (directory / "rules.yaml").write_text(RULES.format(condition=condition))
    config = directory / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 500ms\n"
        f"sources: {{scrape: {{targets: {targets!r}, timeout: 5s}}}}\nrules: [rules.yaml]\n{extra}"
    )
    return config


def rows(db: Path, sql: str) -> list[sqlite3.Row]:
    with sqlite3.connect(db) as connection:
        connection.row_factory = sqlite3.Row
        return list(connection.execute(sql))


def events(db: Path, rule: str) -> list[tuple[str, str]]:
    """(series instance, kind) of every event of ``rule``, in order."""
    found = rows(db, f"SELECT labels, kind FROM events WHERE rule='{rule}' ORDER BY id")
    return [(row["labels"], row["kind"]) for row in found]


def firing(rule: str) -> Callable[[dict[str, Any]], bool]:
    def every_series_fires(body: dict[str, Any]) -> bool:
        states = [r["state"] for r in body["rules"] if r["rule"] == rule]
        return len(states) == 2 and set(states) == {"firing"}

    return every_series_fires


async def rounds_after(daemon: Daemon, moment: float, seconds: float) -> dict[str, Any]:
    """Status once the daemon has been evaluating for ``seconds`` after ``moment``."""
    return await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > moment + seconds, timeout=30)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGHUP"])
async def test_a_slow_targets_firing_series_is_paged_once_across_a_restart_or_reload(
    how: str, tmp_path: Path, unused_tcp_port: int, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    fast, slow = await replayed(aiohttp_server), await replayed(aiohttp_server, delay=SLOW_SCRAPE)
    config = write_config(tmp_path, unused_tcp_port, [fast, slow])
    db = tmp_path / "state" / "specguard.db"
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    daemons.append(daemon)
    daemon.start()
    await daemon.wait_for(firing("low"), timeout=30)
    assert len(events(db, "low")) == 4  # pending, firing for each of the two servers

    if how == "SIGHUP":  # a reload that builds a new source (the timeout changed)
        config.write_text(config.read_text().replace("timeout: 5s", "timeout: 4s"))
        daemon.signal(signal.SIGHUP)
    else:
        daemon.stop(getattr(signal, how))
        daemon.start()
    changed = time.time()
    body = await rounds_after(daemon, changed, 3 * SLOW_SCRAPE + 2)
    assert firing("low")(body)
    assert daemon.stop() == 0

    assert [kind for _, kind in events(db, "low")] == ["pending", "firing"] * 2, "paged twice"
    assert events(db, "missing") == []  # never judged missing while the sources warmed up
    runs = rows(db, "SELECT status, attempts FROM action_runs")
    assert [(r["status"], r["attempts"]) for r in runs] == [("ok", 1), ("ok", 1)]


async def test_while_the_sources_warm_up_status_says_so(
    tmp_path: Path, unused_tcp_port: int, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    slow = await replayed(aiohttp_server, delay=4.0)
    daemon = Daemon(write_config(tmp_path, unused_tcp_port, [slow]), unused_tcp_port, tmp_path / "log")
    daemons.append(daemon)
    daemon.start()
    body = await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > 0)
    host = slow.removeprefix("http://").removesuffix("/metrics")
    assert body["sources"]["warming_up"] == [host]
    assert {r["state"] for r in body["rules"]} == {"inactive"}
    assert daemon.stop() == 0


class _Stderr:
    """The daemon's log through a pipe the test can stop draining: once it is full, the daemon's
    next log line blocks, as it does when journald stalls."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        fcntl.fcntl(self.write_end, 1031, 4096)  # F_SETPIPE_SZ: the smallest pipe the kernel allows
        self.lines: list[bytes] = []
        self._draining = True
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while self._draining:
            ready, _, _ = select.select([self.read_end], [], [], 0.05)
            if ready and self._draining:
                self.lines.append(os.read(self.read_end, 65536))

    def fill(self) -> None:
        """Stop draining, and fill what is left of the pipe."""
        self._draining = False
        self._thread.join()
        # A new open file description of the same pipe: non-blocking for this writer only (the
        # daemon's shares the old one, whose writes must keep blocking).
        filler = os.open(f"/proc/self/fd/{self.write_end}", os.O_WRONLY | os.O_NONBLOCK)
        try:
            while True:
                os.write(filler, b"#" * 512)
        except BlockingIOError:
            pass
        finally:
            os.close(filler)

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


@pytest.mark.parametrize("restart_args", [(), ("--dry-run",)], ids=["restart", "restart-dry-run"])
async def test_a_run_recorded_when_the_daemon_was_killed_is_carried_out_once_after_the_restart(
    restart_args: tuple[str, ...],
    tmp_path: Path,
    unused_tcp_port: int,
    aiohttp_server: AiohttpServer,
    daemons: list[Daemon],
) -> None:
    target = await replayed(aiohttp_server)
    config = write_config(tmp_path, unused_tcp_port, [target], extra="log_level: info\n")
    db = tmp_path / "state" / "specguard.db"
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    daemons.append(daemon)
    stderr = _Stderr()
    try:
        daemon.start(output=stderr.write_end)
        await daemon.wait_for(
            lambda b: any(r["rule"] == "low" and r["state"] == "pending" for r in b["rules"])
        )
        stderr.fill()  # the firing's log line, written after its run is recorded, now blocks
        deadline = time.monotonic() + 20
        while not rows(db, "SELECT * FROM action_runs WHERE status='pending'"):
            assert time.monotonic() < deadline, (
                f"the firing was never recorded; log: {b''.join(stderr.lines)!r}"
            )
            await asyncio.sleep(0.05)
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        stderr.close()

    daemon.start(*restart_args)
    restarted = time.time()
    await rounds_after(daemon, restarted, 1.0)
    assert daemon.stop() == 0
    assert [kind for _, kind in events(db, "low")] == ["pending", "firing"]  # restored, not fired again
    (run,) = rows(db, "SELECT status, reason, attempts FROM action_runs")
    if restart_args:
        assert (run["status"], run["attempts"]) == ("skipped", 0)
        assert run["reason"] == "dry run: a run left from before, not carried out"
    else:
        assert (run["status"], run["attempts"]) == ("ok", 1)
