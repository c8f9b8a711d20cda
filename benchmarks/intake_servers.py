"""The webhook intake benchmark's servers: the bare aiohttp one, specguard's configuration, waiting
for either to listen and stopping it, and what specguard's store held once it stopped."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from intake_load import PATH, TOKEN, Server, Tally

IDLE_TIMEOUT = 10.0  # daemon/server.py's keep-alive, for the bare server too
# specguard waits up to 20 s for a round in progress and 5 s for the HTTP server when it stops.
STOP_TIMEOUT = 30.0


# --- the bare server (run in its own process: bench_webhook_intake.py with --serve-bare PORT) -----


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


# --- specguard ------------------------------------------------------------------------------------


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
