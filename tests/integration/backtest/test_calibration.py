"""A collapse detector calibrated on recorded traffic: a φ too small for it raises false alarms; the
backtest counts them, finds the φ that keeps them within ``false_alarm_every`` by replaying the rule
with it, and ``--write`` proposes it in a copy of the rules file that replays clean."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from specguard.cli.entry import main
from tests.backtest_week import record_history
from tests.week import Conditions, Server

T0 = datetime(2026, 12, 2, 0, tzinfo=UTC).timestamp()
HOURS = 6


def wobbling(t: float) -> Conditions:
    """A draft whose acceptance swings from minute to minute (one minute in seven at 0.6, the
    rest at 0.78): traffic far more dispersed than tokens drawn one by one."""
    minute = int((t - T0) // 60)
    return Conditions(alpha=0.6 if minute % 7 == 3 else 0.78, load=1.0, kv=0.5)


RULES = """
rules:
  # the collapse detector, with a phi far too small for this traffic
  - name: detector
    signal: token_acceptance
    interval: 60s
    detect:
      in_control: 0.75
      drop: [0.12]
      false_alarm_every: 30d
      phi: 1
      min_trials: 100
    no_data: keep
    severity: critical
    actions: [log]
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("host")
    (directory / "state").mkdir()
    record_history(
        directory / "state" / "specguard.db", [Server("vllm-a:8000", "m", 3, wobbling)], T0, HOURS * 60
    )
    (directory / "specguard.yaml").write_text("state_dir: state\n")
    (directory / "rules.yaml").write_text(RULES)
    return directory


def backtest(host: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    until = datetime.fromtimestamp(T0 + HOURS * 3600, UTC).strftime("%Y-%m-%dT%H:%M")
    code = main(
        [
            "backtest",
            "--config",
            str(host / "specguard.yaml"),
            "--since",
            f"{HOURS}h",
            "--until",
            until,
            *args,
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


def test_too_many_false_alarms_get_a_phi_that_is_replayed_before_it_is_proposed(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = backtest(host, capsys, "--rules", str(host / "rules.yaml"), "--json")
    assert code == 0
    (rule,) = json.loads(out)["rules"]
    calibration = rule["calibration"]
    assert rule["firings"] >= 3  # every dip in the first hour fires at phi 1
    assert calibration["false_alarms"] == rule["firings"] and calibration["allowed"] == 0
    assert calibration["counted_as"] == "every firing (no incident known)"
    assert calibration["phi"] == 1 and calibration["phi_from"] == "rule"
    phi = calibration["proposed_phi"]
    assert phi is not None and phi > 1 and calibration["proposed_false_alarms"] == 0
    assert calibration["proposed_h_at_learned_phi"] == pytest.approx(calibration["h"] * phi)
    # The step before the proposal still raised one: the proposal is the smallest of the steps.
    smaller = round(phi / 1.25, 1)
    (host / "smaller.yaml").write_text(RULES.replace("phi: 1\n", f"phi: {smaller}\n"))
    code, out, _ = backtest(host, capsys, "--rules", str(host / "smaller.yaml"), "--json")
    assert json.loads(out)["rules"][0]["firings"] > 0


def test_write_proposes_the_phi_in_a_copy_of_the_rules_file_that_replays_clean(
    host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (host / "rules.yaml").read_text()
    proposed = host / "proposed.yaml"
    code, out, err = backtest(host, capsys, "--rules", str(host / "rules.yaml"), "--write", str(proposed))
    assert code == 0
    assert f"wrote {proposed} (detector phi " in err and "is unchanged" in err
    assert (host / "rules.yaml").read_text() == before  # the live file is never written
    text = proposed.read_text()
    assert "# the collapse detector, with a phi far too small for this traffic" in text  # comments kept
    (line,) = [line for line in text.splitlines() if line.strip().startswith("phi:")]
    assert line.startswith("      phi: ") and "# proposed by specguard backtest (2026-12-02 00:00 to" in line
    assert "calibration: " in out
    code, out, _ = backtest(host, capsys, "--rules", str(proposed), "--json")
    (rule,) = json.loads(out)["rules"]
    assert rule["firings"] == 0 and rule["calibration"]["proposed_phi"] is None


def test_write_with_nothing_to_propose_writes_nothing(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (host / "calm.yaml").write_text(RULES.replace("phi: 1\n", "phi: 500\n"))
    code, out, err = backtest(
        host, capsys, "--rules", str(host / "calm.yaml"), "--write", str(host / "none.yaml")
    )
    assert code == 0 and not (host / "none.yaml").exists()
    assert "nothing to propose" in err
    assert "0 false alarm(s), at most 0 in 6h (one per 4w2d): phi 500 and h" in out
