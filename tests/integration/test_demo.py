"""`specguard demo` runs to completion by itself, as README command one promises."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from sim.demo import Timeline

RULES = (
    "acceptance_low",
    "acceptance_critical",
    "acceptance_fallback",
    "latency_regression",
    "memory_pressure",
    "speculation_unprofitable",
)


def test_the_demo_runs_to_completion_and_every_shipped_rule_fires(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "demo", "--no-color", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: the demo's own clock is checked below
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    # The demo stamps every line with its own clock; every rule fired before its deadline.
    fired_at = {rule: int(at) for rule, at in re.findall(r"^  (\S+) +firing +fired at (\d+)s$", out, re.M)}
    assert fired_at.keys() == set(RULES), out
    assert max(fired_at.values()) <= Timeline().deadline
    assert "\033[" not in out, "--no-color output carries escape codes"
    assert "Traceback" not in out + done.stderr
    for rule in RULES:
        assert re.search(rf"^\[ *\d+s\] {rule} +(pending|inactive) -> firing", out, re.M), rule
    assert "action log: ok" in out
    assert "Slack (not configured) would post to on-call:" in out
    assert "baseline measured: e2e p95" in out and "config reloaded (ok)" in out
    assert str(tmp_path / "specguard.db") in out

    with sqlite3.connect(tmp_path / "specguard.db") as db:
        fired = {row[0] for row in db.execute("SELECT rule FROM events WHERE kind='firing'")}
        runs = db.execute("SELECT status, count(*) FROM action_runs GROUP BY status").fetchall()
    assert fired == set(RULES)
    assert dict(runs).get("ok", 0) >= len(RULES)
    assert (tmp_path / "baseline.json").is_file()


def test_ctrl_c_stops_the_demo_cleanly(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "daemon", "demo", "--no-color", "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (tmp_path / "specguard.db").exists():
            time.sleep(0.2)
        time.sleep(3)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, f"{out}\n{err}"
    assert "interrupted: everything stopped cleanly" in out
    assert "Traceback" not in out + err
