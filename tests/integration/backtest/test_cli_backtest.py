"""``specguard backtest`` as an operator runs it: on a state database's history (three hours of two
servers, one whose draft collapses for half an hour), its table and JSON, two rules files side by
side, and every input it cannot use refused in one line with exit status 2, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from specguard.cli.entry import main
from tests.backtest_week import record_history
from tests.week import Conditions, Server

T0 = datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp()
HOURS = 3
COLLAPSE = (T0 + 3600, T0 + 5400)

CONFIG = """
state_dir: state
interval: 15s
actions:
  fallback:
    type: feature_flag
    file: {path: flag.json, engage: {speculative: false}, restore: {speculative: true}}
    quiet_period: 10m
    cooldown: 1h
"""

RULES = """
rules:
  - name: acceptance_fallback
    signal: acceptance_rate
    window: 60s
    interval: 60s
    consecutive: 3
    condition: "< 0.4"
    no_data: keep
    severity: critical
    actions: [log, fallback]
  - name: acceptance_low
    signal: acceptance_rate
    window: 5m
    condition: "< 0.5"
    for: 10m
    severity: warning
    actions: [log]
  - name: by_engine
    signal: acceptance_rate
    group_by: [instance, engine]
    condition: "< 0.5"
    actions: [log]
"""

CANDIDATE = """
rules:
  - name: acceptance_fallback
    signal: acceptance_rate
    window: 60s
    interval: 60s
    consecutive: 1
    condition: "< 0.45"
    no_data: keep
    severity: critical
    actions: [log, fallback]
"""


def collapsing(t: float) -> Conditions:
    return Conditions(alpha=0.25 if COLLAPSE[0] <= t < COLLAPSE[1] else 0.8, load=1.0, kv=0.5)


def steady(t: float) -> Conditions:
    return Conditions(alpha=0.8, load=1.0, kv=0.5)


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("host")
    (directory / "state").mkdir()
    servers = [Server("vllm-a:8000", "m", 5, collapsing), Server("vllm-b:8000", "m", 5, steady)]
    record_history(directory / "state" / "specguard.db", servers, T0, HOURS * 60)
    (directory / "specguard.yaml").write_text(CONFIG)
    (directory / "rules.yaml").write_text(RULES)
    (directory / "candidate.yaml").write_text(CANDIDATE)
    return directory


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.chdir(host)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["backtest", "--config", "specguard.yaml", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


PERIOD = ("--since", "3h", "--until", _iso(T0 + HOURS * 3600))


def test_the_table_shows_each_rule_its_firings_actions_and_what_history_cannot_replay(run: Run) -> None:
    code, out, err = run("--rules", "rules.yaml", *PERIOD)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("backtest of rules.yaml: 2026-12-01 10:00:00 to 2026-12-01 13:00:00 UTC (3h)")
    fallback = next(line for line in lines if line.startswith("acceptance_fallback "))
    assert " 1 " in fallback and "fallback 1 ok, 1 restore ok" in fallback and "log 2 ok" in fallback
    low = next(line for line in lines if line.startswith("acceptance_low "))
    assert "1m (15s live)" in low
    assert next(line for line in lines if line.startswith("by_engine ")).endswith("not replayed")
    assert "instance=vllm-a:8000,model_name=m: pending 2026-12-01 11:01:00, firing 2026-12-01 11:03:00" in out
    assert "not replayed: history keeps series by instance and model_name only" in out and "engine" in out
    assert "note: evaluated once a minute, not every 15s" in out
    # The flag's restore, after its quiet period, is shown with the run it was.
    assert "2026-12-01 11:41:00 fallback restore ok: speculative decoding restored after 38m engaged" in out


def test_the_logging_level_is_put_back_for_whatever_runs_next(run: Run) -> None:
    import logging

    said = logging.getLogger("specguard")
    before = said.level
    said.setLevel(logging.INFO)
    try:
        assert run("--rules", "candidate.yaml", *PERIOD)[0] == 0
        assert said.level == logging.INFO
    finally:
        said.setLevel(before)


def test_a_period_longer_than_history_says_what_it_holds(run: Run) -> None:
    code, out, _ = run("--rules", "candidate.yaml", "--since", "5h", "--until", _iso(T0 + HOURS * 3600))
    assert code == 0
    assert "note: history holds 2026-12-01 10:00 to 2026-12-01 13:00 UTC of the period only" in out
    code, out, _ = run("--rules", "candidate.yaml", "--since", "2h", "--until", _iso(T0 - 3600))
    assert code == 0 and "holds no history in the period: nothing to replay" in out
    assert "no firing in 120 evaluations of 0 series" in out


def test_json_holds_the_episodes_actions_and_totals(run: Run) -> None:
    code, out, _ = run("--rules", "rules.yaml", "--rule", "acceptance_fallback", *PERIOD, "--json")
    assert code == 0
    found = json.loads(out)
    (rule,) = found["rules"]
    (episode,) = rule["episodes"]
    assert episode["labels"] == {"instance": "vllm-a:8000", "model_name": "m"}
    assert episode["fired"] == COLLAPSE[0] + 180 and episode["resolved"] == COLLAPSE[1] + 60
    assert rule["action_counts"] == {"fallback": {"ok": 1, "restore ok": 1}, "log": {"ok": 2}}
    assert found["flags"]["fallback"][0]["change"] == "engage"
    assert found["totals"]["firings"] == 1 and found["source"] == "history"


def test_two_rules_files_side_by_side(run: Run) -> None:
    code, out, _ = run(
        "--rules", "rules.yaml", "--rule", "acceptance_fallback", "--compare", "candidate.yaml", *PERIOD
    )
    assert code == 0
    table = out.split("\n\n")[0].splitlines()
    assert table[0] == "side by side:"
    assert table[1].split() == ["rules.yaml", "candidate.yaml"]
    firings = next(line for line in table if line.startswith("firings"))
    assert firings.split()[1:] == ["1", "1"]
    # One breaching minute is enough for the candidate: it fires two minutes sooner.
    code, out, _ = run("--rules", "candidate.yaml", *PERIOD, "--json")
    (rule,) = json.loads(out)["rules"]
    assert rule["episodes"][0]["fired"] == COLLAPSE[0] + 60


def test_html_writes_the_page_beside_the_table(run: Run, host: Path) -> None:
    code, out, _ = run("--rules", "rules.yaml", *PERIOD, "--compare", "candidate.yaml", "--html", "page.html")
    assert code == 0 and out.startswith("side by side:")
    page = (host / "page.html").read_text()
    assert page.startswith("<!doctype html>") or page.lower().startswith("<!doctype html>")
    for name in ("rules.yaml", "candidate.yaml", "acceptance_fallback", "acceptance_low", "by_engine"):
        assert name in page
    from specguard.report import charts

    if charts.available() is None:  # a timeline for each series of each run that replayed a rule
        assert page.count("data:image/png;base64,") >= 5
    else:
        assert "Charts are not included" in page


def test_incidents_score_the_candidate_with_its_delays(run: Run, host: Path) -> None:
    (host / "incidents.yaml").write_text(
        "incidents:\n"
        f"  - {{start: '{_iso(COLLAPSE[0])}:00Z', end: '{_iso(COLLAPSE[1])}:00Z', match: {{instance: 'vllm-a:8000'}}}}\n"
        f"  - {{start: '{_iso(T0 + 600)}:00Z', end: '{_iso(T0 + 900)}:00Z', match: {{instance: 'vllm-b:8000'}},"
        " note: a blip on b nothing saw}\n"
    )
    code, out, _ = run("--rules", "candidate.yaml", *PERIOD, "--incidents", "incidents.yaml", "--json")
    assert code == 0
    (rule,) = json.loads(out)["rules"]
    scored = rule["incidents"]
    assert (scored["concerned"], scored["caught"], len(scored["missed"])) == (2, 1, 1)
    assert scored["missed"][0]["note"] == "a blip on b nothing saw" and scored["false_alarms"] == []
    assert scored["delays"][0]["to_firing"] == 60.0 and scored["delays"][0]["to_action"] == 60.0


def test_a_silence_recorded_live_defers_the_fallback_as_it_did(run: Run, host: Path) -> None:
    """The live store's silences over the period are applied: the engage waits for the silence's
    end, recorded as a deferral with its reason, and then happens."""
    import shutil
    import sqlite3

    from specguard.dispatch import silences

    shutil.copytree(host / "state", host / "silenced", dirs_exist_ok=True)
    db = sqlite3.connect(host / "silenced" / "specguard.db", isolation_level=None)
    db.row_factory = sqlite3.Row
    silences.add(db, "acceptance_fallback", {"instance": "vllm-a:8000"}, COLLAPSE[0] - 600, COLLAPSE[0] + 1200,
                 "rolling out draft v2", "alice", COLLAPSE[0] - 600)  # fmt: skip
    db.close()
    code, out, _ = run("--rules", "candidate.yaml", *PERIOD, "--state-dir", "silenced", "--json")
    assert code == 0
    found = json.loads(out)
    assert found["silences_copied"] == 1
    (rule,) = found["rules"]
    engage = [a for a in rule["actions"] if a["action"] == "fallback" and a["mode"] == "run"]
    assert [(a["status"], a["event"]) for a in engage] == [("ok", "firing")]
    assert engage[0]["finished"] == COLLAPSE[0] + 1200  # at the silence's end, not at the firing
    (held,) = engage[0]["held"]  # and why it waited, from when
    assert (
        held["status"] == "deferred"
        and "silence" in held["reason"]
        and "rolling out draft v2" in held["reason"]
    )
    assert held["at"] == COLLAPSE[0] + 60 and held["until"] == COLLAPSE[0] + 1200
    assert found["flags"]["fallback"][0] == {"at": COLLAPSE[0] + 1200, "change": "engage"}
    code, text, _ = run("--rules", "candidate.yaml", *PERIOD, "--state-dir", "silenced")
    assert "1 silence(s) recorded live over the period were applied" in text
    assert "2026-12-01 11:01:00 fallback deferred until 2026-12-01 11:20:00: silence" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--rules", "missing.yaml"), "specguard backtest: missing.yaml: no such rules file"),
        (("--rules", "rules.yaml", "--rule", "nope"), "specguard backtest: --rule: rules.yaml has no rule nope"),
        (("--rules", "rules.yaml", "--since", "a week"), "specguard backtest: --since: "),
        (("--rules", "rules.yaml", "--since", "30s"), "specguard backtest: --since: give at least a minute, not 30s"),
        (("--rules", "rules.yaml", "--since", "100d"), "specguard backtest: --since: at most 90d in one run, not 100d"),
        (("--rules", "rules.yaml", "--until", "tomorrow"), "specguard backtest: --until: 'tomorrow' is not a date"),
        (("--rules", "rules.yaml", "--until", "2999-01-01"), "specguard backtest: --until: 2999-01-01 is in the future"),
        (("--rules", "rules.yaml", "--incidents", "nowhere.yaml"), "nowhere.yaml: cannot read file"),
        (("--rules", "rules.yaml", "--html", "no/such/dir/page.html"), "specguard backtest: no/such/dir/page.html: no directory"),
        (("--rules", "rules.yaml", "--write", "rules.yaml"), "specguard backtest: --write: rules.yaml is a rules file being replayed"),
        (("--rules", "rules.yaml", "--state-dir", "empty"), "specguard backtest: no state database at"),
        (("--rules", "rules.yaml", "--from-prometheus"), "specguard backtest: --from-prometheus: give the URL"),
    ],
)  # fmt: skip
def test_input_it_cannot_use_is_refused_in_one_line(
    run: Run, host: Path, args: tuple[str, ...], said: str
) -> None:
    (host / "empty").mkdir(exist_ok=True)
    code, out, err = run(*args, *(PERIOD if "--since" not in args and "--until" not in args else ()))
    assert code == 2 and out == ""
    assert err.startswith(said), err
    assert "Traceback" not in err


def test_a_page_it_may_not_write_is_refused_in_one_line(run: Run, host: Path) -> None:
    (host / "locked").mkdir(exist_ok=True)
    (host / "locked" / "page.html").mkdir(exist_ok=True)  # a directory where the page would go
    code, out, err = run("--rules", "candidate.yaml", *PERIOD, "--html", "locked/page.html")
    assert code == 2 and out == ""
    assert err.startswith("specguard backtest: cannot write ") and "Traceback" not in err


def test_a_bad_rule_is_refused_with_its_file_line_and_field(run: Run, host: Path) -> None:
    (host / "bad.yaml").write_text(
        "rules:\n  - name: x\n    signal: acceptance_rate\n    condition: '< lots'\n"
    )
    code, _, err = run("--rules", "bad.yaml", *PERIOD)
    assert code == 2
    assert err.startswith("bad.yaml:4: rules[0].condition:") or "bad.yaml:4:" in err, err


def test_an_unreachable_prometheus_is_refused_with_the_reason(run: Run) -> None:
    code, out, err = run("--rules", "candidate.yaml", *PERIOD, "--from-prometheus", "http://127.0.0.1:9")
    assert code == 2 and out == ""
    assert "prometheus http://127.0.0.1:9: connection refused" in err
