"""The Alertmanager webhook on a daemon in this process: the retry contract (200 only once stored,
401, 400, 413, 415, 503), deduplication across restarts, and rules moved by alerts."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from tests.am_payloads import alert, message
from tests.readings import Readings

TOKEN = "s3cret-token"
LOW = {"alertname": "AcceptanceLow", "instance": "vllm-a:8000", "severity": "warning"}
OTHER = {"alertname": "DiskFull", "instance": "vllm-a:8000"}

RULES = """\
rules:
  - name: am_low
    alert:
      match: {alertname: AcceptanceLow, severity: {"=~": "warning|critical"}}
    group_by: [instance]
    keep_firing_for: KEEP
  - name: confirm
    signal: acceptance_rate
    condition: "< 0.5"
    window: 10s
    interval: 1h            # only the alert (and the first round) evaluates it here
    alert:
      match: {alertname: AcceptanceLow}
"""


def write_config(tmp_path: Path, keep: str = "0s", token: bool = True) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES.replace("KEEP", keep))
    (tmp_path / "token").write_text(TOKEN + "\n")
    path = tmp_path / "specguard.yaml"
    server = (
        "server: {port: 0, webhook_token_file: token, webhook_max_body_size: 64KiB}\n"
        if token
        else "server: {port: 0}\n"
    )
    path.write_text(server + "state_dir: state\ninterval: 200ms\nrules: [rules.yaml]\n")
    return path


Post = Callable[..., Awaitable[tuple[int, dict[str, Any]]]]


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Daemon]]]:
    running: list[Daemon] = []

    async def start(keep: str = "0s", token: bool = True, value: float = 0.2) -> Daemon:
        """A daemon whose source reads ``value``; its start waits for the first round (READY=1)."""
        path = write_config(tmp_path, keep, token)
        loaded = load(path)
        assert loaded.ok, loaded.problems
        daemon = Daemon(loaded, path)
        daemon.source = Readings(value)
        await daemon.start(handle_signals=False)
        running.append(daemon)
        return daemon

    yield start
    for daemon in running:
        if daemon.scheduler is not None and daemon.scheduler.running:
            await daemon.shutdown()


async def post(
    daemon: Daemon,
    body: bytes | dict[str, Any],
    token: str | None = TOKEN,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{daemon.port}/alertmanager", data=data, headers=headers) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def settled(daemon: Daemon) -> None:
    """Until every stored alert has been acted on (state, not time: a loaded machine takes longer)."""
    for _ in range(400):
        if daemon.intake.queue.empty() and not daemon.busy:
            rows = sqlite3.connect(daemon.store.path).execute(
                "SELECT COUNT(*) FROM alert_receipts WHERE processed IS NULL"
            )
            if rows.fetchone()[0] == 0:
                return
        await asyncio.sleep(0.025)
    raise AssertionError("alerts were not acted on")


def events(daemon: Daemon, rule: str) -> list[tuple[str, str, str]]:
    db = sqlite3.connect(daemon.store.path)
    return [
        (kind, labels, trigger)
        for kind, labels, trigger in db.execute(
            "SELECT kind, labels, trigger FROM events WHERE rule=? ORDER BY id", (rule,)
        )
    ]


def runs(daemon: Daemon, rule: str) -> list[tuple[str, str]]:
    db = sqlite3.connect(daemon.store.path)
    return list(
        db.execute(
            "SELECT e.kind, r.status FROM action_runs r JOIN events e ON e.id = r.event_id WHERE e.rule=? "
            "ORDER BY r.id",
            (rule,),
        )
    )


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    total = 0.0
    for family in daemon.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def test_a_firing_alert_fires_the_alert_rule_and_triggers_the_signal_rule_once(
    started: Callable[..., Awaitable[Daemon]],
) -> None:
    daemon = await started(value=0.9)  # healthy at the first round; the hourly schedule will not look again
    source = daemon.source
    assert isinstance(source, Readings)
    for _ in range(400):
        if daemon.last_round_of.get(3600.0) is not None:  # the hourly round ran, at start
            break
        await asyncio.sleep(0.025)
    assert daemon.states["confirm"]['{"instance":"vllm-a:8000"}'].state.value == "inactive"
    source.value = 0.2
    firing = message(alert(LOW), alert(OTHER))
    status, body = await post(daemon, firing)
    assert (status, body["status"], body["new"], body["duplicates"]) == (200, "stored", 2, 0)
    await settled(daemon)
    trigger = "alertmanager: AcceptanceLow firing (delivery 1)"
    assert events(daemon, "am_low") == [
        ("pending", '{"instance": "vllm-a:8000"}', trigger),
        ("firing", '{"instance": "vllm-a:8000"}', trigger),
    ]
    assert runs(daemon, "am_low") == [("firing", "ok")]
    # the signal rule is evaluated at once on the alert, on specguard's own reading
    assert events(daemon, "confirm") == [
        ("pending", '{"instance": "vllm-a:8000"}', trigger),
        ("firing", '{"instance": "vllm-a:8000"}', trigger),
    ]

    # Alertmanager repeats itself (retries, repeat_interval): stored once, acted on once
    for _ in range(3):
        status, body = await post(daemon, firing)
        assert (status, body["status"], body["new"], body["duplicates"]) == (200, "duplicate", 0, 2)
    await settled(daemon)
    assert runs(daemon, "am_low") == [("firing", "ok")]
    assert metric(daemon, "specguard_webhook_duplicate_alerts_total") == 6
    assert metric(daemon, "specguard_webhook_deliveries_total", outcome="duplicate") == 3
    assert metric(daemon, "specguard_webhook_alerts_total", status="firing") == 8

    status, body = await post(daemon, message(alert(LOW, status="resolved")))
    assert (status, body["new"]) == (200, 1)
    await settled(daemon)
    assert events(daemon, "am_low")[-1] == (
        "resolved",
        '{"instance": "vllm-a:8000"}',
        "alertmanager: AcceptanceLow resolved (delivery 5)",
    )
    assert runs(daemon, "am_low") == [("firing", "ok"), ("resolved", "ok")]
    # a late copy of the firing state (a retry that lost its race) changes nothing
    status, body = await post(daemon, firing)
    assert body["status"] == "duplicate"
    await settled(daemon)
    assert runs(daemon, "am_low") == [("firing", "ok"), ("resolved", "ok")]

    rows = {row["rule"]: row for row in daemon.status()["rules"]}
    assert rows["am_low"]["moved_by"] == "alertmanager: AcceptanceLow resolved (delivery 5)"
    assert rows["am_low"]["alert"] == ['alertname="AcceptanceLow"', 'severity=~"warning|critical"']
    assert daemon.status()["webhook"] == {
        "path": "/alertmanager",
        "authenticated": True,
        "watched_alerts": {"firing": 0, "resolved": 1},  # DiskFull: stored, no rule watches it
    }


async def test_deduplication_and_unfinished_work_survive_a_restart(
    started: Callable[..., Awaitable[Daemon]],
) -> None:
    daemon = await started()
    firing = message(alert(LOW))
    assert (await post(daemon, firing))[0] == 200
    await settled(daemon)
    await daemon.shutdown()

    again = await started()
    status, body = await post(again, firing)
    assert (status, body["status"]) == (200, "duplicate")
    await settled(again)
    assert runs(again, "am_low") == [("firing", "ok")]
    assert again.status()["webhook"]["watched_alerts"] == {"firing": 1, "resolved": 0}

    # stored but not acted on when the process stopped (as after a SIGKILL): acted on at the start
    await again.shutdown()
    db = sqlite3.connect(again.store.path)
    with db:
        db.execute("UPDATE alert_receipts SET processed = NULL")
        db.execute("DELETE FROM action_runs")
        db.execute("DELETE FROM events")
        db.execute("DELETE FROM series_state")
    third = await started()
    await settled(third)
    assert [kind for kind, _, _ in events(third, "am_low")] == ["pending", "firing"]
    assert runs(third, "am_low") == [("firing", "ok")]


async def test_a_stop_while_alerts_are_acted_on_lets_them_finish_and_no_more(
    started: Callable[..., Awaitable[Daemon]], caplog: pytest.LogCaptureFixture
) -> None:
    daemon = await started()
    source = daemon.source
    assert isinstance(source, Readings)
    source.delay = 0.5  # the triggered signal rule reads slowly: the stop comes in the middle
    assert (await post(daemon, message(alert(LOW))))[0] == 200
    for _ in range(400):
        if daemon.busy and source.queries:
            break
        await asyncio.sleep(0.01)
    await daemon.shutdown()
    # the batch finished (its rule was evaluated and stored); the worker that waits for the next
    # delivery is not a round to wait for: no "stopped mid-round" after the whole grace period
    assert "stopped mid-round" not in caplog.text
    assert [kind for kind, _, _ in events(daemon, "confirm")][-1] == "firing"


async def test_keep_firing_for_runs_its_course_on_the_schedule(
    started: Callable[..., Awaitable[Daemon]],
) -> None:
    daemon = await started(keep="1s")
    assert (await post(daemon, message(alert(LOW))))[0] == 200
    await settled(daemon)
    assert (await post(daemon, message(alert(LOW, status="resolved"))))[0] == 200
    await settled(daemon)
    assert events(daemon, "am_low")[-1][0] == "firing"  # kept firing for a second
    for _ in range(400):
        if events(daemon, "am_low")[-1][0] == "resolved":
            break
        await asyncio.sleep(0.025)
    kind, _, trigger = events(daemon, "am_low")[-1]
    assert (kind, trigger) == ("resolved", "schedule")
    db = sqlite3.connect(daemon.store.path)
    (fired_at,), (resolved_at,) = db.execute(
        "SELECT at FROM events WHERE rule='am_low' AND kind IN ('firing', 'resolved') ORDER BY id"
    )
    (ok_at,) = db.execute("SELECT received FROM deliveries WHERE id=2").fetchone()
    assert fired_at < ok_at
    assert resolved_at - ok_at >= 1.0  # recorded times, not the wall clock of this test


@pytest.mark.parametrize(
    ("token", "expected"),
    [(None, "missing bearer token"), ("wrong", "wrong bearer token"), (TOKEN + "x", "wrong bearer token")],
)
async def test_wrong_or_missing_credentials_are_401_and_nothing_is_stored(
    started: Callable[..., Awaitable[Daemon]], token: str | None, expected: str
) -> None:
    daemon = await started()
    status, body = await post(daemon, message(alert(LOW)), token=token)
    assert (status, body["reason"]) == (401, expected)
    assert sqlite3.connect(daemon.store.path).execute("SELECT COUNT(*) FROM deliveries").fetchone() == (0,)
    assert metric(daemon, "specguard_webhook_deliveries_total", outcome="unauthorized") == 1


@pytest.mark.parametrize(
    ("body", "content_type", "status", "reason"),
    [
        (b"{", "application/json", 400, "the body is not JSON"),
        (b"\xff\xfe", "application/json", 400, "the body is not UTF-8"),
        (b"[]", "application/json", 400, "not a JSON object"),
        (
            json.dumps({**message(alert(LOW)), "version": "3"}).encode(),
            "application/json",
            400,
            "version '3'",
        ),
        (
            json.dumps(message({**alert(LOW), "startsAt": "yesterday"})).encode(),
            "application/json",
            400,
            "alerts.0.startsAt",
        ),
        (
            json.dumps(message(alert(LOW))).encode(),
            "text/plain",
            415,
            "Content-Type must be application/json",
        ),
        (b"x" * 70_000, "application/json", 413, "body over the limit of 65536 bytes"),
    ],
)
async def test_bad_bodies_are_4xx_with_a_reason(
    started: Callable[..., Awaitable[Daemon]], body: bytes, content_type: str, status: int, reason: str
) -> None:
    daemon = await started()
    answer, payload = await post(daemon, body, content_type=content_type)
    assert answer == status
    assert reason in payload["reason"]
    assert sqlite3.connect(daemon.store.path).execute("SELECT COUNT(*) FROM deliveries").fetchone() == (0,)


async def test_a_store_that_cannot_write_answers_503_and_the_retry_is_stored(
    started: Callable[..., Awaitable[Daemon]],
) -> None:
    daemon = await started()
    await daemon.store.refuse_writes(True)
    status, body = await post(daemon, message(alert(LOW)))
    assert status == 503
    assert "cannot store the delivery" in body["reason"]
    await daemon.store.refuse_writes(False)
    status, body = await post(daemon, message(alert(LOW)))  # Alertmanager's retry
    assert (status, body["status"]) == (200, "stored")
    await settled(daemon)
    assert runs(daemon, "am_low") == [("firing", "ok")]


async def test_alerts_left_out_by_max_alerts_are_logged_and_counted(
    started: Callable[..., Awaitable[Daemon]], caplog: pytest.LogCaptureFixture
) -> None:
    daemon = await started()
    status, _ = await post(daemon, message(alert(LOW), truncatedAlerts=7))
    assert status == 200
    assert metric(daemon, "specguard_webhook_truncated_alerts_total") == 7
    assert "left out 7 alerts (Alertmanager's max_alerts)" in caplog.text


async def test_the_bearer_scheme_is_case_insensitive(started: Callable[..., Awaitable[Daemon]]) -> None:
    daemon = await started()
    data = json.dumps(message(alert(LOW))).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{daemon.port}/alertmanager",
            data=data,
            headers={"Content-Type": "application/json", "Authorization": f"bearer {TOKEN}"},
        ) as answer,
    ):
        assert answer.status == 200


async def test_without_a_token_on_loopback_deliveries_need_no_credentials(
    started: Callable[..., Awaitable[Daemon]],
) -> None:
    daemon = await started(token=False)
    status, _ = await post(daemon, message(alert(LOW)), token=None)
    assert status == 200
    assert daemon.status()["webhook"]["authenticated"] is False


async def test_the_book_holds_watched_alerts_and_a_reload_reads_the_others_back(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path
) -> None:
    daemon = await started()
    status, body = await post(daemon, message(alert(LOW), alert(OTHER)))
    assert (status, body["new"]) == (200, 2)
    await settled(daemon)
    # DiskFull is stored, but no rule watches it: the book (memory) does not keep it
    assert sorted(r.name for r in daemon.alerts.alerts.values()) == ["AcceptanceLow"]

    # a reload adds a rule on DiskFull: the alert stored before is read back, and the rule sees
    # its series firing at its next evaluation, without Alertmanager sending it again
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        rules.read_text()
        + "  - name: disk\n    alert:\n      match: {alertname: DiskFull}\n    group_by: [instance]\n"
    )
    assert await daemon.reload()
    assert sorted(r.name for r in daemon.alerts.alerts.values()) == ["AcceptanceLow", "DiskFull"]
    for _ in range(400):
        state = daemon.states.get("disk", {}).get('{"instance":"vllm-a:8000"}')
        if state is not None and state.state.value == "firing":
            break
        await asyncio.sleep(0.025)
    else:
        raise AssertionError(f"the new rule did not fire: {daemon.states.get('disk')}")

    # and a later delivery of an alert no rule watches is stored, not kept in memory
    status, body = await post(daemon, message(alert({"alertname": "Unwatched", "instance": "x"})))
    assert (status, body["new"]) == (200, 1)
    await settled(daemon)
    assert "Unwatched" not in {r.name for r in daemon.alerts.alerts.values()}
