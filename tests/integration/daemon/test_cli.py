"""`specguard eval --once` and `specguard signals` as an operator runs them, in their own process."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from specguard.common.sequential import Dispersion, kl, llr, threshold
from specguard.engine.detector_state import DetectorState, calibration_of
from specguard.engine.states import series_key
from specguard.rules.schema import Rule
from specguard.rules.signals import CATALOG
from specguard.store.database import Store
from specguard.store.records import SeriesState, State, Verdict
from tests.processes import specguard


def rows_of(out: str) -> list[dict[str, Any]]:
    rows = json.loads(out)
    assert isinstance(rows, list)
    for row in rows:
        assert {"rule", "signal", "labels", "value", "threshold", "state"} <= row.keys()
    return rows


async def test_eval_once_json_reports_value_threshold_and_state_per_series(vllm: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(
        "rules:\n"
        "  - {name: below_07, signal: acceptance_rate, window: 1m, condition: '< 0.7'}\n"
        "  - {name: below_07_for, signal: acceptance_rate, window: 1m, condition: '< 0.7', for: 5m}\n"
        "  - {name: mal, signal: mean_acceptance_length, window: 1m, condition: '< 2'}\n"
        "  - {name: positions, signal: acceptance_by_position, window: 1m, condition: '< 0.5'}\n"
    )
    (tmp_path / "specguard.yaml").write_text("rules: [rules.yaml]\n")
    code, out, err = await specguard(
        "eval", "--once", "--config", str(tmp_path / "specguard.yaml"), "--scrape", vllm,
        "--sample-gap", "0.5", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    rows = {(r["rule"], r["labels"].get("position")): r for r in rows_of(out)}
    fires = rows[("below_07", None)]
    assert (fires["value"], fires["threshold"], fires["state"]) == (pytest.approx(0.6), 0.7, "firing")
    assert fires["labels"]["model_name"] == "tiny-llama"
    assert rows[("below_07_for", None)]["state"] == "pending"
    mal = rows[("mal", None)]
    assert (mal["value"], mal["state"]) == (pytest.approx(4.0), "inactive")
    by_position = {p: rows[("positions", p)]["value"] for p in "01234"}
    assert by_position == pytest.approx({"0": 0.9, "1": 0.8, "2": 0.7, "3": 0.5, "4": 0.1})


async def test_eval_once_table_on_the_default_rules_and_an_unreachable_server(unused_tcp_port: int) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}/metrics"
    code, out, err = await specguard("eval", "--once", "--scrape", url, "--sample-gap", "0")
    assert code == 1  # the table, and a failure: nothing could be read
    assert (
        f"specguard eval: could not read 1 of 1 target (the rules saw no data from them):\n  {url}: " in err
    )
    paragraph, table = out.split("\n\n")
    # it says what it is: a reading of its own over the gap, not the daemon's view
    assert paragraph.startswith("A fresh reading, not the daemon's: two scrapes ")
    assert "`specguard status`" in paragraph and "--window-from-rule" in paragraph
    lines = table.splitlines()
    assert lines[0].split() == [
        "RULE",
        "SIGNAL",
        "LABELS",
        "VALUE",
        "THRESHOLD",
        "VERDICT",
        "STATE",
        "OVER",
        "TRIGGER",
    ]
    verdicts = {line.split()[0]: line.split()[-6] for line in lines[1:]}
    assert {line.split()[-3] for line in lines[1:]} == {"of"}  # "2ms of 5m": the gap, not the window
    assert {line.split()[-1] for line in lines[1:]} == {"schedule"}
    assert verdicts == {
        "acceptance_low": "no_data",
        "acceptance_critical": "no_data",
        "acceptance_fallback": "no_data",
        "acceptance_collapse": "no_data",
        "latency_regression": "error",  # no baseline configured
        "latency_mean_regression": "error",
        "memory_pressure": "no_data",
        "speculation_unprofitable": "error",  # no baseline: the draft's cost is unknown
    }
    assert "needs a baseline" in err


async def test_eval_refuses_an_invalid_config_with_its_problems(tmp_path: Path) -> None:
    (tmp_path / "specguard.yaml").write_text("interval: soon\n")
    code, _, err = await specguard("eval", "--once", "--config", str(tmp_path / "specguard.yaml"))
    assert code == 1
    assert "specguard.yaml:1: interval: invalid duration 'soon'" in err


async def test_signals_lists_every_catalog_signal_with_its_promql() -> None:
    code, out, _ = await specguard("signals", "--format", "json", "--window", "2m")
    assert code == 0
    items = {item["signal"]: item for item in json.loads(out)}
    assert items.keys() == CATALOG.keys()
    assert items["acceptance_rate"]["promql"] == (
        "sum by (instance, model_name) (rate(vllm:spec_decode_num_accepted_tokens_total[2m])) / "
        "(sum by (instance, model_name) (rate(vllm:spec_decode_num_draft_tokens_total[2m])) > 0)"
    )
    kv = [m["name"] for m in items["kv_cache_usage"]["metrics"]]
    assert kv == ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]


async def test_version_and_help() -> None:
    code, out, _ = await specguard("--version")
    assert code == 0 and out.startswith("specguard ")
    for command in ("run", "check", "eval", "signals"):
        code, out, _ = await specguard(command, "--help")
        assert code == 0 and f"usage: specguard {command}" in out


async def test_run_refuses_to_listen_beyond_loopback_without_a_webhook_token(tmp_path: Path) -> None:
    code, _, err = await specguard("run", "--listen", "0.0.0.0", "--state-dir", str(tmp_path / "state"))
    assert code == 1
    assert "server.listen: listening on 0.0.0.0 would take Alertmanager webhooks from anyone" in err
    assert "specguard: not starting: the configuration has errors" in err
    assert not (tmp_path / "state").exists()  # refused before anything was created


DETECTOR_RULES = """\
rules:
  - name: collapse
    signal: token_acceptance
    interval: 5s
    detect: {in_control: learn, drop: 0.2, false_alarm_every: 30d, warmup: 1m, min_trials: 10}
"""


def fingerprint(directory: Path) -> tuple[str, int]:
    """The database's bytes, and what its write-ahead log holds: a reader of a WAL database may
    create the (empty) log and its index; a writer would put pages in the log."""
    wal = directory / "specguard.db-wal"
    return (
        hashlib.sha256((directory / "specguard.db").read_bytes()).hexdigest(),
        wal.stat().st_size if wal.exists() else 0,
    )


async def test_eval_steps_a_stored_detector_on_by_one_window_without_writing_its_database(
    vllm: str, tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(DETECTOR_RULES)
    config = tmp_path / "specguard.yaml"
    config.write_text("state_dir: state\nrules: [rules.yaml]\n")
    args = ("eval", "--once", "--config", str(config), "--scrape", vllm, "--sample-gap", "0.5")
    h = threshold(30 * 86400 / 5) + math.log(2)  # one level and the window test

    # No daemon has run: the series starts its warm-up, and eval leaves no database behind.
    code, out, err = await specguard(*args)
    assert code == 0, err
    assert out.splitlines()[-1] == (
        f"collapse: CUSUM G 0 of h {h:.4g}; phi -; acceptance - -> -; last window 0.7692 over 39 "
        "trials; warming up (1/12 windows)"
    )  # one scrape of the replay: 30 accepted, 10 drafts, 1 accepted whole: 30 / (30 + 9)
    assert not (tmp_path / "state").exists()

    # A daemon (stopped since) left its detector calibrated: phi 2.5, alpha0 0.85, G 3.
    detect = Rule.model_validate(
        {"name": "collapse", "signal": "token_acceptance", "interval": "5s", "detect": {
            "in_control": "learn", "drop": 0.2, "warmup": "1m", "min_trials": 10}}
    ).detect  # fmt: skip
    assert detect is not None
    labels = {"instance": urlsplit(vllm).netloc, "model_name": "tiny-llama"}
    stored = DetectorState(
        g=3.0, gs=[3.0], alpha0=0.85, phi=2.5, warmup=Dispersion(windows=12, successes=1000.0, trials=1200.0),
        alpha=0.8, trials=400.0, windows=40, seen=time.time() - 60, calibration=calibration_of(detect, 5.0),
    )  # fmt: skip
    state = SeriesState(
        labels, State.INACTIVE, verdict=Verdict.OK, value=3.0, threshold=h, detector=stored.to_json()
    )
    store = Store(tmp_path / "state" / "specguard.db")
    await store.open()
    await store.commit_evaluation("collapse", {series_key(labels): state}, [], None)
    await store.close()
    before = fingerprint(tmp_path / "state")

    code, out, err = await specguard(*args)
    assert code == 0, err
    g = 3.0 + llr(30, 9, 0.85, 0.65) / 2.5  # the stored G and one window's evidence over the stored phi
    # ... and the window by itself, with the windows' own dispersion (1: the stored sums show none)
    evidence = 39 * kl(30 / 39, 0.85)
    assert out.splitlines()[-1] == (
        f"collapse: CUSUM G {g:.4g} of h {h:.4g}; phi 2.5; acceptance 0.85 -> 0.65; last window "
        f"0.7692 over 39 trials, its own evidence {evidence:.4g} (phi 1)"
    )
    code, out, err = await specguard(*args, "--format", "json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["detector"] == {
        "method": "cusum", "g": pytest.approx(g), "g_by_level": [pytest.approx(g)], "h": pytest.approx(h),
        "phi": 2.5, "in_control": 0.85, "shift_to": [pytest.approx(0.65)],
        "window_alpha": pytest.approx(30 / 39), "window_trials": 39.0, "warmup": "12/12 windows",
        "warming_up": False, "window_evidence": pytest.approx(evidence), "window_phi": 1.0,
        # Learned (no baseline), and calibrated before warm-ups were checked for a shift: never checked.
        "in_control_from": "warm-up", "warmup_alpha": 0.85, "homogeneous": None, "not_homogeneous": None,
    }  # fmt: skip
    assert fingerprint(tmp_path / "state") == before  # read, never written

    # The config now has 10 s windows: the stored phi is of 5 s ones, and eval says it would not
    # judge with it.
    (tmp_path / "rules.yaml").write_text(DETECTOR_RULES.replace("interval: 5s", "interval: 10s"))
    code, out, err = await specguard(*args)
    assert code == 0, err
    assert out.splitlines()[-1].endswith("warming up (1/6 windows)")
    assert "warms up again: the interval changed from 5s to 10s" in err
    assert fingerprint(tmp_path / "state") == before
