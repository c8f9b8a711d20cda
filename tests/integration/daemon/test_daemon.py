"""The daemon as an operator runs it: `specguard run` in its own process, against a local server
replaying a real vLLM 0.32.0 capture, with its state in a real SQLite file.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.processes import Daemon

# The replayed server's acceptance is 30 accepted / 50 drafted = 0.6 in every window.
RULES = """\
rules:
  - name: acceptance_below_07
    signal: acceptance_rate
    window: 10s
    interval: 500ms
    condition: "{condition}"
    for: 1s
    severity: critical
    annotations:
      summary: "acceptance {{value:.2f}} on {{labels[instance]}}"
"""


def _state(body: dict[str, Any], rule: str = "acceptance_below_07") -> list[dict[str, Any]]:
    return [row for row in body["rules"] if row["rule"] == rule]


@pytest.fixture
async def daemon(tmp_path: Path, vllm: str, unused_tcp_port: int) -> AsyncIterator[Daemon]:
    (tmp_path / "rules.yaml").write_text(RULES.format(condition="< 0.7"))
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {unused_tcp_port}}}\n"
        f"state_dir: state\n"
        f"interval: 500ms\n"
        f"sources: {{scrape: {{targets: ['{vllm}'], timeout: 2s}}}}\n"
        f"rules: [rules.yaml]\n"
    )
    running = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    yield running
    if running.process is not None and running.process.poll() is None:
        running.process.kill()
        running.process.wait()


def _firing_events(state_dir: Path) -> list[sqlite3.Row]:
    with sqlite3.connect(state_dir / "specguard.db") as db:
        db.row_factory = sqlite3.Row
        return list(db.execute("SELECT * FROM events WHERE kind='firing'"))


def _runs(state_dir: Path) -> list[sqlite3.Row]:
    with sqlite3.connect(state_dir / "specguard.db") as db:
        db.row_factory = sqlite3.Row
        return list(db.execute("SELECT * FROM action_runs"))


async def test_a_firing_rule_stays_firing_across_a_restart_without_firing_again(
    daemon: Daemon,
) -> None:
    state_dir = daemon.config.parent / "state"
    daemon.start()
    body = await daemon.wait_for(lambda b: any(r["state"] == "firing" for r in _state(b)))
    row = _state(body)[0]
    assert row["value"] == pytest.approx(0.6)
    assert row["threshold"] == 0.7
    assert row["labels"]["model_name"] == "tiny-llama"
    assert daemon.stop() == 0

    events = _firing_events(state_dir)
    assert len(events) == 1
    runs = _runs(state_dir)
    assert [(r["action"], r["status"]) for r in runs] == [("log", "ok")]
    fired_at = events[0]["at"]

    daemon.start()
    restarted = time.time()
    body = await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > restarted + 1.5)
    rows = _state(body)
    assert [r["state"] for r in rows] == ["firing"]
    assert rows[0]["since"] == pytest.approx(fired_at, abs=1e-6)  # restored as stored
    assert daemon.stop() == 0
    assert len(_firing_events(state_dir)) == 1, "the restart fired the rule a second time"
    assert len(_runs(state_dir)) == 1
    stops = [line for line in daemon.logs() if line["msg"] == "stopping"]
    assert len(stops) == 2


def _sample(text: str, name: str) -> float:
    (line,) = [
        line for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    return float(line.rsplit(" ", 1)[1])


async def test_http_endpoints_report_health_status_and_own_metrics(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_for(lambda b: any(r["state"] == "firing" for r in _state(b)))
    status, health = await daemon.get("/healthz")
    assert status == 200 and health["status"] == "ok"
    # The firing's log run is carried out beside the rounds: it may end a moment after the state.
    runs = 'specguard_action_runs_total{action="log",status="ok"}'
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, text = await daemon.get("/metrics")
        assert status == 200
        if runs in text and _sample(text, runs) >= 1:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail(f"the firing's log run was not counted within 20 s:\n{text}")
    breaches = 'specguard_evaluations_total{result="breach",rule="acceptance_below_07"}'
    assert 'specguard_rule_series{rule="acceptance_below_07",state="firing"} 1.0' in text
    assert "specguard_evaluation_duration_seconds_bucket" in text
    assert _sample(text, 'specguard_action_runs_total{action="log",status="ok"}') == 1
    before = _sample(text, breaches)
    await asyncio.sleep(1.5)  # three more rounds at 500 ms
    _, later = await daemon.get("/metrics")
    assert _sample(later, breaches) > before  # the daemon's own counters move with its rounds
    _, body = await daemon.get("/api/status")
    for key in ("rule", "signal", "labels", "state", "value", "since"):
        assert key in body["rules"][0]
    assert daemon.stop(signal.SIGINT) == 0


async def test_sighup_keeps_the_old_config_when_the_new_one_is_invalid(daemon: Daemon) -> None:
    rules = daemon.config.parent / "rules.yaml"
    daemon.start()
    await daemon.wait_for(lambda b: any(r["state"] == "firing" for r in _state(b)))

    rules.write_text(RULES.format(condition="<< 0.7"))
    daemon.signal(signal.SIGHUP)
    await _wait_log(daemon, "reload failed")
    body = await daemon.wait_for(lambda b: bool(_state(b)))
    assert _state(body)[0]["state"] == "firing"
    errors = [line["msg"] for line in daemon.logs() if line["level"] == "error"]
    assert any("rules.yaml:6: rules[0].condition: invalid condition" in msg for msg in errors)

    rules.write_text(RULES.format(condition="< 0.5"))
    daemon.signal(signal.SIGHUP)
    await _wait_log(daemon, "reloaded")
    body = await daemon.wait_for(lambda b: any(r["state"] == "resolved" for r in _state(b)))
    assert _state(body)[0]["threshold"] == 0.5
    assert daemon.stop() == 0
    with sqlite3.connect(daemon.config.parent / "state" / "specguard.db") as db:
        done = db.execute(
            "SELECT e.kind, r.action, r.status FROM action_runs r JOIN events e ON e.id = r.event_id ORDER BY r.id"
        ).fetchall()
    assert done == [("firing", "log", "ok"), ("resolved", "log", "ok")]  # resolving runs the actions too


@pytest.mark.parametrize("how", ["config", "command line"])
async def test_dry_run_records_every_run_as_skipped_and_runs_none(daemon: Daemon, how: str) -> None:
    if how == "config":
        daemon.config.write_text(daemon.config.read_text() + "dry_run: true\n")
        daemon.start()
    else:
        daemon.start("--dry-run")
    body = await daemon.wait_for(lambda b: any(r["state"] == "firing" for r in _state(b)))
    assert body["dry_run"] is True
    assert daemon.stop() == 0
    runs = _runs(daemon.config.parent / "state")
    assert [(r["action"], r["status"], r["reason"], r["attempts"]) for r in runs] == [
        ("log", "skipped", "dry run", 0)
    ]
    assert not [line for line in daemon.logs() if line.get("logger") == "specguard.action.log"]


async def test_a_target_that_refuses_connections_is_no_data_not_a_crash(
    tmp_path: Path, unused_tcp_port_factory: Callable[[], int]
) -> None:
    closed = unused_tcp_port_factory()
    port = unused_tcp_port_factory()
    (tmp_path / "rules.yaml").write_text(RULES.format(condition="< 0.7"))
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 500ms\n"
        f"sources: {{scrape: {{targets: ['http://127.0.0.1:{closed}/metrics']}}}}\nrules: [rules.yaml]\n"
    )
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemon.start()
    try:
        body = await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > 0)
        await asyncio.sleep(1.5)
        _, body = await daemon.get("/api/status")
        row = _state(body)[0]
        assert row["state"] == "inactive" and row["value"] is None
        status, _health = await daemon.get("/healthz")
        assert status == 200
    finally:
        assert daemon.stop() == 0


async def test_healthz_turns_503_with_the_reason_when_rounds_stall_and_200_when_they_resume(
    tmp_path: Path, unused_tcp_port_factory: Callable[[], int], aiohttp_server: Any
) -> None:
    """A Prometheus that stops answering holds every round (a 60 s query timeout) until it answers."""
    answering = asyncio.Event()

    async def query(_: Any) -> Any:
        await answering.wait()
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    prometheus = await aiohttp_server(app, host="127.0.0.1")
    port = unused_tcp_port_factory()
    (tmp_path / "rules.yaml").write_text(RULES.format(condition="< 0.7"))
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\n"
        f"sources: {{prometheus: {{url: 'http://127.0.0.1:{prometheus.port}', timeout: 60s}}}}\n"
        f"rules: [rules.yaml]\n"
    )
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemon.start()
    try:
        await daemon.wait_for(lambda b: True)  # listening
        deadline = time.monotonic() + 60
        while True:  # rounds stop at once; /healthz allows max(3 intervals, 10 s)
            status, health = await daemon.get("/healthz")
            if status == 503 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert status == 503, health
        assert health["status"] == "stalled"
        assert health["reason"].startswith("the 500ms rules last ran ")
        answering.set()
        await daemon.wait_for(lambda b: b["last_evaluation"] is not None)
        status, health = await daemon.get("/healthz")
        assert (status, health["status"]) == (200, "ok")
    finally:
        answering.set()
        assert daemon.stop() == 0


async def _wait_log(daemon: Daemon, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line["msg"] for line in daemon.logs()):
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"no log line containing {text!r}:\n{daemon.log.read_text()[-3000:]}")
