"""`specguard run` in its own process against the faults of a host: a full disk under its state, a
connection flood on its port, a state directory it cannot use, credentials in a target's URL, and a
--state-dir given relative to where the command runs, and a second process opening the new
state database at the same moment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.processes import Daemon, specguard
from tests.real import missing
from tests.replay import CAPTURE, ReplayedVllm

RULES = """\
rules:
  - {name: low, signal: acceptance_rate, window: 10s, interval: 500ms, condition: "< 0.7"}
  # No series ever, so nothing to write: its rounds succeed even on a full disk, and must not be
  # taken for the store writing again.
  - {name: quiet, signal: acceptance_rate, window: 10s, interval: 500ms, condition: "< 0.7",
     match: {model_name: nobody}}
"""


class SwitchedVllm:
    """Idle (no drafts, so no acceptance) until ``busy`` is set; then acceptance 0.6."""

    def __init__(self) -> None:
        self.busy = False
        self.replay = ReplayedVllm()
        self.idle = CAPTURE.read_text()

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(text=self.replay() if self.busy else self.idle, content_type="text/plain")


async def switched(aiohttp_server: AiohttpServer) -> tuple[str, SwitchedVllm]:
    vllm = SwitchedVllm()
    app = web.Application()
    app.router.add_get("/metrics", vllm.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}/metrics", vllm


def config_file(directory: Path, port: int, target: str, state_dir: str = "state") -> Path:
    (directory / "rules.yaml").write_text(RULES)
    path = directory / "specguard.yaml"
    path.write_text(
        f"server: {{port: {port}}}\nstate_dir: {state_dir}\ninterval: 500ms\nrules: [rules.yaml]\n"
        f"sources: {{scrape: {{targets: ['{target}'], timeout: 2s}}}}\n"
    )
    return path


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where``: a disk that really fills. Needs root (CI is)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = f"cannot mount a tmpfs ({done.stderr.strip() or done.returncode}): needs root"
        missing(message)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    """Write a file into ``directory`` until the disk is full."""
    filler = directory / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


async def test_a_full_disk_is_reported_once_held_off_and_recovered_from_without_losing_a_page(
    tmp_path: Path, unused_tcp_port: int, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    target, vllm = await switched(aiohttp_server)
    with small_tmpfs(tmp_path / "disk", "1M") as disk:
        config = config_file(tmp_path, unused_tcp_port, target, state_dir=str(disk))
        daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
        daemons.append(daemon)
        daemon.start()
        await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > 0)
        filler = fill(disk)
        vllm.busy = True  # the rule breaches now, and its transition has to be written
        body = await daemon.wait_for(lambda b: b["store"]["error"] is not None, timeout=30)
        assert "full" in body["store"]["error"], body["store"]
        status, health = await daemon.get("/healthz")
        assert (status, health["status"]) == (503, "store_failing")
        failing_since = time.time()
        await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > failing_since + 2)
        _, body = await daemon.get("/api/status")
        assert {r["state"] for r in body["rules"]} == {"inactive"}, body["rules"]  # nothing decided unwritten
        assert body["store"]["error"] is not None

        filler.unlink()  # space is back
        body = await daemon.wait_for(lambda b: any(r["state"] == "firing" for r in b["rules"]), timeout=30)
        assert body["store"]["error"] is None
        status, _ = await daemon.get("/healthz")
        assert status == 200
        _, metrics = await daemon.get("/metrics")
        assert daemon.stop() == 0
        with sqlite3.connect(disk / "specguard.db") as db:
            kinds = [row[0] for row in db.execute("SELECT kind FROM events ORDER BY id")]
    assert kinds == ["pending", "firing"]  # each recorded once, when the store could write
    failing = [line for line in daemon.logs() if "cannot write the state store" in line["msg"]]
    assert len(failing) == 1 and "exc" not in failing[0]  # said once, without a traceback
    (errors,) = [line for line in metrics.splitlines() if line.startswith("specguard_store_errors_total ")]
    assert float(errors.split()[1]) >= 3


def _raise_nofile(limit: int) -> None:
    """Let this process open ``limit`` files (root may raise the hard limit too; CI runs as root)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= limit:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(hard, limit)))
    except (ValueError, OSError) as exc:
        message = f"cannot open {limit} files for the flood (limit {soft}/{hard}: {exc})"
        missing(message)


async def test_a_connection_flood_neither_blinds_the_daemon_nor_floods_its_log(
    tmp_path: Path, unused_tcp_port: int, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    """1,100 connections that never send a request, against a daemon limited to 1,024 file
    descriptors (the soft limit of a login shell): without a cap, it runs out of them."""
    target, vllm = await switched(aiohttp_server)
    vllm.busy = True
    config = config_file(tmp_path, unused_tcp_port, target)
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    daemons.append(daemon)
    _raise_nofile(4096)  # the test's own side of the flood
    with _nofile_limit(1024):
        daemon.start()
    await daemon.wait_for(lambda b: any(r["state"] == "firing" for r in b["rules"]))
    assert daemon.process is not None
    flood: list[socket.socket] = []
    try:
        for _ in range(1100):
            connection = socket.socket()
            connection.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                connection.connect(("127.0.0.1", unused_tcp_port))
            flood.append(connection)
        during = time.time()
        answers: list[float] = []
        open_files: list[int] = []  # the daemon's, sampled during the flood
        deadline = time.monotonic() + 20
        while len(answers) < 3 and time.monotonic() < deadline:
            open_files.append(len(os.listdir(f"/proc/{daemon.process.pid}/fd")))
            asked = time.monotonic()
            with contextlib.suppress(Exception):
                status, _ = await daemon.get("/healthz", timeout=5)
                if status == 200:
                    answers.append(time.monotonic() - asked)
            await asyncio.sleep(0.5)
        body = await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > during + 2, timeout=20)
        _, metrics = await daemon.get("/metrics")
    finally:
        for connection in flood:
            connection.close()
    assert len(answers) == 3, "no answer from /healthz during the flood"
    assert body["rules"][0]["verdict"] == "breach"  # scrapes went on: the rule still sees its data
    assert daemon.stop() == 0
    log = daemon.log.read_text().splitlines()
    assert len(log) < 50, f"{len(log)} log lines during the flood"
    # The server never held more than its cap of 256 connections (its open files, sampled above,
    # add the sockets accepted and not yet handed to it, which depends on scheduling)...
    print(f"daemon's open files during the flood: {open_files}")
    assert _metric(metrics, "specguard_http_connections_peak") == 256
    # ...by closing the oldest idle ones to make room
    assert _metric(metrics, "specguard_http_connections_evicted_total") > 0


def _metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


@contextlib.contextmanager
def _nofile_limit(limit: int) -> Iterator[None]:
    """Children started inside get at most ``limit`` file descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_state_directory_it_cannot_use_is_one_line_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = config_file(tmp_path, 0, "http://127.0.0.1:9/metrics", state_dir=str(blocker / "state"))
    code, _, err = await specguard("run", "--config", str(config), "--log-format", "json")
    assert code == 1
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("specguard: ")]
    assert line.startswith(
        f"specguard: cannot create the state directory {blocker / 'state'}: Not a directory"
    )
    code, _, err = await specguard("check", "--config", str(config))
    assert code == 1
    assert f"state_dir: {blocker / 'state'}: {blocker} is not a directory" in err


async def test_credentials_in_a_target_url_never_reach_the_log_or_the_status(
    tmp_path: Path, unused_tcp_port_factory: Any, daemons: list[Daemon]
) -> None:
    closed, port = unused_tcp_port_factory(), unused_tcp_port_factory()
    target = f"http://admin:s3cr3t-pw@127.0.0.1:{closed}/metrics?token=tok-9f2e&page=1"
    config = config_file(tmp_path, port, target)
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemons.append(daemon)
    daemon.start()
    body = await daemon.wait_for(
        lambda b: bool(b["sources"]["targets"]) and b["sources"]["targets"][0]["failures"] > 0
    )
    _, metrics = await daemon.get("/metrics")
    assert daemon.stop() == 0
    shown = str(body) + metrics + daemon.log.read_text()
    assert "s3cr3t-pw" not in shown and "tok-9f2e" not in shown and "admin:" not in shown
    (health,) = body["sources"]["targets"]
    assert health["target"] == f"http://127.0.0.1:{closed}/metrics?token=<redacted>&page=1"
    assert health["state"] == "down" and "ClientConnectorError" in health["last_error"]


async def test_a_state_dir_on_the_command_line_is_relative_to_where_the_command_runs(
    tmp_path: Path, unused_tcp_port: int, daemons: list[Daemon]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "etc").mkdir()
    config = config_file(tmp_path / "etc", unused_tcp_port, "http://127.0.0.1:9/metrics")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specguard",
            "run",
            "--config",
            str(config),
            "--state-dir",
            "here",
            "--log-format",
            "json",
        ],
        cwd=elsewhere,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    try:
        deadline = time.monotonic() + 30
        while not (elsewhere / "here" / "specguard.db").exists():
            assert time.monotonic() < deadline, "no database under the working directory"
            assert process.poll() is None, "specguard run exited"
            await asyncio.sleep(0.2)
    finally:
        process.terminate()
        process.wait(timeout=15)
    assert not (config.parent / "here").exists()


def _open_store_when_told(path: str, start: Any, errors: Any) -> None:
    from specguard.store.connection import open_database

    start.wait()
    try:
        open_database(Path(path)).close()
    except sqlite3.Error as exc:
        errors.put(f"{exc.sqlite_errorname}: {exc}")


def test_two_processes_opening_a_new_state_database_together_both_open_it(tmp_path: Path) -> None:
    """The daemon starting while `specguard ladder show` (or history, report) opens the database it
    is creating: turning a new file to WAL takes an exclusive lock that SQLite does not wait for by
    itself. Once, in a loaded CI run, the daemon lost that race and exited ("database is locked")."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for attempt in range(60):
        path = tmp_path / str(attempt) / "specguard.db"
        path.parent.mkdir()
        start = context.Event()
        openers = [
            context.Process(target=_open_store_when_told, args=(str(path), start, errors)) for _ in range(3)
        ]
        for opener in openers:
            opener.start()
        start.set()
        for opener in openers:
            opener.join(30)
            assert opener.exitcode == 0
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == []
