"""tests/supervisor.py, the stand-in for systemd that the restart tests restart servers with: how it
records the command's end, and what `status` and `show` say of it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.supervisor import show, status


def supervise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.supervisor", *args], capture_output=True, text=True, timeout=60
    )


def until_ended(state: Path) -> None:
    deadline = time.monotonic() + 30
    while status(state)[0] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)


def test_status_and_show_say_how_the_command_runs_or_ended(tmp_path: Path) -> None:
    state = tmp_path / "service"
    assert supervise("status", "--state", str(state)).returncode == 1  # not started
    assert "ActiveState=inactive\n" in show(state)

    assert supervise("restart", "--state", str(state), "--", "sleep", "60").returncode == 0
    running = supervise("status", "--state", str(state))
    assert running.returncode == 0 and running.stdout.startswith("running (pid ")
    assert show(state).startswith("ActiveState=active\nSubState=running\nResult=success\n")

    assert supervise("restart", "--state", str(state), "--", "sh", "-c", "exit 3").returncode == 0
    until_ended(state)
    ended = supervise("status", "--state", str(state))
    assert ended.returncode == 1 and ended.stdout.startswith("exited with status 3 after "), ended.stdout
    assert show(state) == (
        "ActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainStatus=3\nNRestarts=0\n"
    )

    supervise("restart", "--state", str(state), "--", "sh", "-c", "kill -9 $$")
    until_ended(state)
    assert status(state)[2].startswith("killed by signal 9 after ")
    assert "Result=signal\nExecMainStatus=9\n" in show(state)
    supervise("stop", "--state", str(state))


def test_a_stop_waits_for_the_command_to_act_on_its_sigterm(tmp_path: Path) -> None:
    state, said = tmp_path / "service", tmp_path / "said"
    slow = f"trap 'sleep 0.5; echo stopped > {said}; exit 0' TERM; while :; do sleep 0.1; done"
    supervise("restart", "--state", str(state), "--", "sh", "-c", slow)
    time.sleep(0.3)  # the trap set
    assert supervise("stop", "--state", str(state)).returncode == 0
    assert said.read_text() == "stopped\n"  # not killed by the group's SIGKILL before it was done
    assert status(state)[0] == "gone"
