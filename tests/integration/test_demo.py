"""`specguard demo` runs to completion by itself, as README command one promises, and shows the
whole loop with the real actions: the flag file written and restored, the router following it, the
Slack thread on the loopback Web API, history telling it afterwards."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from sim.demo import CHANNEL

MILESTONES = {
    "drop": r"traffic moves to temperature 1\.5",
    "firing": r"acceptance_fallback +pending -> firing",
    "engaged": r"action fallback: ok: fallback engaged: wrote \S+flag\.json",
    "moved": r"router: flag\.json says speculative: false -> traffic to standard decoding",
    "posted": rf"Slack {CHANNEL} received a message:",
    "calm": r"the hot traffic ends: temperature back to 0",
    "resolved": r"acceptance_fallback +firing -> resolved",
    "restored": r"action fallback \(restore\): ok: speculative decoding restored .*\(canary: acceptance "
    r"0\.\d+ over \d+ draft tokens \(4 requests\), at or above 0\.5\)",
    "back": r"router: flag\.json says speculative: true -> traffic back to speculative decoding",
}


def demo(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", "demo", "--no-color", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: the demo's own clock is checked below
        stdin=subprocess.DEVNULL,
    )


def test_the_demo_closes_the_loop_with_the_real_actions(tmp_path: Path) -> None:
    done = demo(tmp_path)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert "\033[" not in out, "--no-color output carries escape codes"
    assert "Traceback" not in out + done.stderr
    lines = out.splitlines()

    # Each milestone once, and in the order the loop goes (the output is written as things happen).
    at: dict[str, int] = {}
    for name, pattern in MILESTONES.items():
        found = [i for i, line in enumerate(lines) if re.search(rf"^\[ *\d+s\] {pattern}", line)]
        assert len(found) == 1, (name, out)
        at[name] = found[0]
    assert at["drop"] < at["firing"] < at["engaged"] < at["moved"] < at["calm"]
    assert at["engaged"] < at["posted"]  # the notice waits its group_wait, then says the fallback's outcome
    assert at["moved"] < at["resolved"] < at["restored"] < at["back"]
    assert at["calm"] < at["restored"]
    # The thread's first message, edited last: resolved, with the restore among its actions.
    edits = [
        i for i, line in enumerate(lines) if f"Slack {CHANNEL}: the thread's first message was edited" in line
    ]
    assert edits and edits[-1] > at["restored"], out
    last_edit = lines[edits[-1] + 1 : edits[-1] + 8]
    assert last_edit[0].strip() == "| RESOLVED · CRITICAL · acceptance_fallback", last_edit
    assert any(
        "• fallback (restore) at" in line and "speculative decoding restored" in line for line in last_edit
    )
    assert re.search(r"a reply in the thread:\n +\| Resolved at \d\d:\d\d:\d\d UTC: no data to judge", out)

    # What the router's clients saw: collapsed speculation slower than standard decoding, which is
    # slower than healthy speculation; back to healthy once restored.
    latency = re.search(
        r"clients' p95: healthy ([\d.]+)s, collapsed ([\d.]+)s, on the fallback ([\d.]+)s, restored ([\d.]+)s",
        out,
    )
    assert latency, out
    healthy, collapsed, fallback, restored = map(float, latency.groups())
    assert collapsed > fallback > healthy and fallback > restored, latency.group(0)

    # The real files and the store.
    assert json.loads((tmp_path / "flag.json").read_text()) == {"speculative": True}
    assert json.loads((tmp_path / "flag.json.prev").read_text()) == {"speculative": False}
    with sqlite3.connect(tmp_path / "specguard.db") as db:
        runs = db.execute(
            "SELECT action, mode, status FROM action_runs WHERE action != 'log' ORDER BY id"
        ).fetchall()
        notes = [
            row[0] for row in db.execute("SELECT text FROM action_notes WHERE action='oncall' ORDER BY id")
        ]
    assert runs == [
        ("fallback", "run", "ok"),
        ("oncall", "run", "ok"),
        ("fallback", "restore", "ok"),
        ("oncall", "run", "ok"),
    ], runs
    assert notes[0].startswith(f"notice 1 posted to {CHANNEL} (ts "), notes
    assert any(n.startswith("notice 2 replied in the thread: Resolved at") for n in notes), notes
    assert str(tmp_path / "specguard.db") in out

    # history tells the same story afterwards, the Slack deliveries under the firing
    shown = subprocess.run(
        [sys.executable, "-m", "daemon", "history", "--config", str(tmp_path / "specguard.yaml"),
         "--rule", "acceptance_fallback"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert re.search(r"firing -> resolved +schedule +log:ok, fallback\(restore\):ok, oncall:ok", shown), shown
    assert re.search(r"pending -> firing +schedule +log:ok, fallback:ok, oncall:ok", shown), shown
    assert re.search(rf"^ +\d\d:\d\d:\d\d oncall: notice 1 posted to {CHANNEL} \(ts ", shown, re.M), shown


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
