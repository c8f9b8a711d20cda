"""`specguard eval --alerts` (a saved Alertmanager delivery, evaluated as if it had arrived) and
`specguard history` (what moved each rule, and how its actions ended), with their bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from specguard.cli import main
from specguard.store.database import Store
from specguard.store.records import Event, EventRecord, PlannedRun, SeriesState, State
from tests.am_payloads import alert, message

RULES = """\
rules:
  - name: am_low
    alert: {match: {alertname: AcceptanceLow}}
    group_by: [instance]
  - name: confirm
    signal: acceptance_rate
    condition: "< 0.5"
    alert: {match: {alertname: AcceptanceLow}, status: resolved}
"""


@pytest.fixture
def config(tmp_path: Path, unused_tcp_port: int) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES)
    path = tmp_path / "specguard.yaml"
    path.write_text(
        f"sources: {{scrape: {{targets: ['http://127.0.0.1:{unused_tcp_port}/metrics']}}}}\n"
        "rules: [rules.yaml]\nstate_dir: state\n"
    )
    return path


def test_eval_with_a_saved_delivery_fires_the_alert_rule_and_names_the_trigger(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    delivery = config.parent / "delivery.json"
    delivery.write_text(json.dumps(message(alert({"alertname": "AcceptanceLow", "instance": "a:1"}))))
    code = main(
        [
            "eval",
            "--once",
            "--sample-gap",
            "0.05",
            "--config",
            str(config),
            "--alerts",
            str(delivery),
            "--format",
            "json",
        ]
    )
    assert code == 1  # `confirm` reads the scrape target, which is down: said, and not a success
    rows = {row["rule"]: row for row in json.loads(capsys.readouterr().out)}
    assert (rows["am_low"]["state"], rows["am_low"]["value"], rows["am_low"]["labels"]) == (
        "firing",
        1,
        {"instance": "a:1"},
    )
    assert rows["am_low"]["trigger"] == "alertmanager: AcceptanceLow firing (--alerts)"
    assert rows["confirm"]["trigger"] == "schedule"  # it is triggered by resolved alerts only


def test_eval_without_alerts_says_what_feeds_an_alert_rule(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an alert rule reads no source: the scrape target being down is no failure of its evaluation
    assert main(["eval", "--once", "--sample-gap", "0.05", "--config", str(config), "--rule", "am_low"]) == 0
    captured = capsys.readouterr()
    assert "am_low: an alert rule is fed by Alertmanager's webhook" in captured.err
    assert "could not read" not in captured.err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read it (No such file or directory)"),
        (b'{"version": "4"}', "not an Alertmanager webhook body: groupKey: Field required"),
        (b"\xff", "not an Alertmanager webhook body: the body is not UTF-8"),
    ],
)
def test_eval_refuses_a_bad_alerts_file_in_one_line(
    config: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, expected: str
) -> None:
    delivery = config.parent / "delivery.json"
    if content is not None:
        delivery.write_bytes(content)
    assert main(["eval", "--once", "--config", str(config), "--alerts", str(delivery)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"specguard eval: --alerts {delivery}: ")
    assert expected in line


async def record_two_changes(config: Path) -> None:
    store = Store(config.parent / "state" / "specguard.db")
    await store.open()
    labels = {"instance": "a:1"}
    firing = Event(
        "am_low",
        "k",
        labels,
        State.FIRING,
        State.PENDING,
        1_800_000_000.0,
        1.0,
        0.0,
        "alertmanager: A firing (delivery 3)",
    )
    resolved = Event("am_low", "k", labels, State.RESOLVED, State.FIRING, 1_800_000_060.0, 0.0, 0.0)
    for event in (firing, resolved):
        said = "1 alert firing" if event.kind is State.FIRING else "no alert firing any more"
        record = EventRecord(
            event, "warning", said, {}, False, False, [PlannedRun("log", "pending")], event.trigger
        )
        await store.commit_evaluation("am_low", {"k": SeriesState(labels=labels)}, [record])
    await store.close()


def test_history_lists_changes_newest_first_with_trigger_and_runs(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(record_two_changes(config))
    assert main(["history", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TIME", "(UTC)", "RULE", "LABELS", "CHANGE", "TRIGGER", "ACTIONS"]
    assert "firing -> resolved" in lines[1] and "schedule" in lines[1] and lines[1].endswith("log:pending")
    # under each change, what it said: worded for that transition
    assert lines[2].split(maxsplit=1) == ["said:", "no alert firing any more"]
    assert "pending -> firing" in lines[3] and "alertmanager: A firing (delivery 3)" in lines[3]
    assert lines[4].split(maxsplit=1) == ["said:", "1 alert firing"]
    assert (
        main(["history", "--config", str(config), "--format", "json", "--limit", "1", "--rule", "am_low"])
        == 0
    )
    (only,) = json.loads(capsys.readouterr().out)
    assert (only["kind"], only["trigger"], only["runs"][0]["action"]) == ("resolved", "schedule", "log")


def test_history_since_keeps_the_recent_changes(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(record_two_changes(config))
    monkeypatch.setattr(
        "specguard.cli.history.time.time", lambda: 1_800_000_070.0
    )  # 10 s after the resolution
    assert main(["history", "--config", str(config), "--since", "30s", "--format", "json"]) == 0
    assert [e["kind"] for e in json.loads(capsys.readouterr().out)] == ["resolved"]
    assert main(["history", "--config", str(config), "--since", "2m", "--format", "json"]) == 0
    assert [e["kind"] for e in json.loads(capsys.readouterr().out)] == ["resolved", "firing"]
    assert main(["history", "--config", str(config), "--since", "yesterday"]) == 2
    assert "specguard history: --since: invalid duration 'yesterday'" in capsys.readouterr().err


def test_history_without_a_database_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["history", "--state-dir", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert f"no state database at {tmp_path / 'nowhere' / 'specguard.db'}" in err
