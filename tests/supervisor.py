"""A stand-in for systemd where the tests restart a server: ``restart`` stops the process it started
last (SIGTERM, then SIGKILL after a grace) and starts the command again, detached, returning at
once as ``systemctl restart`` does for a simple service (one stop or restart at a time, as systemd
runs one job at a time on a unit), with the variables of an environment file
(``EnvironmentFile=``) in its environment. Like systemd/vllm.service, a command that needs them on
its command line goes through ``/bin/sh -c``.

The command runs under a watcher that waits for it and records how it ended, as systemd records a
unit's main process. ``status`` exits 0 while the command runs and 1 once it has ended, saying how
(vllm_restart's ``status_command``); ``show`` prints the same as ``systemctl show`` prints a unit's
ActiveState, SubState, Result, ExecMainStatus and NRestarts (never restarted by itself: 0).

    python -m tests.supervisor restart --state DIR [--env-file FILE] [--cpus LIST] -- COMMAND...
    python -m tests.supervisor stop|status|show --state DIR

``--cpus``: the CPUs the command may run on (as systemd's ``CPUAffinity=``), whatever CPUs this
script runs on; by default the command inherits this script's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE = 20.0


def read_env(path: Path) -> dict[str, str]:
    return parse_env(path.read_text())


def parse_env(text: str) -> dict[str, str]:
    """An environment file's variables, quotes removed as systemd removes them."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        words = shlex.split(value)
        values[name.strip()] = words[0] if words else ""
    return values


def stop(state: Path) -> None:
    pid = _pid(state)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and not _gone(pid):
            os.killpg(pid, 0)  # raises once the group is gone
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    (state / "pid").unlink(missing_ok=True)


def _pid(state: Path) -> int | None:
    """The watcher's, leader of the command's process group."""
    try:
        return int((state / "pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def watch(state: Path, command: list[str]) -> int:
    """Run ``command`` and record how it ended. A stop's SIGTERM, sent to the whole group, is the
    command's to act on: this process waits for it, so the group's leader lives as long as the
    command (a Python handler, not SIG_IGN, which the command would inherit)."""
    signal.signal(signal.SIGTERM, lambda *_: None)
    started = time.monotonic()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    returncode = process.wait()
    record = {"pid": os.getpid(), "returncode": returncode, "after": time.monotonic() - started}
    written = state / "exit.tmp"
    written.write_text(json.dumps(record))
    written.replace(state / "exit")
    return 0


def status(state: Path) -> tuple[str, int | None, str]:
    """("running" | "exited" | "gone", the command's exit status (negative: a signal), a line)."""
    pid = _pid(state)
    if pid is None:
        return "gone", None, "not started"
    try:
        ended = json.loads((state / "exit").read_text())
    except (FileNotFoundError, ValueError):
        ended = None
    if ended is not None and ended["pid"] == pid:
        code = int(ended["returncode"])
        how = f"exited with status {code}" if code >= 0 else f"killed by signal {-code}"
        return "exited", code, f"{how} after {ended['after']:.0f}s"
    if not _gone(pid):
        return "running", None, f"running (pid {pid})"
    return "gone", None, "gone, its end not recorded"


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped (this script is not its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def show(state: Path) -> str:
    """``systemctl show``'s lines for the command as a unit's main process."""
    how, code, _ = status(state)
    active, sub, result, main = "inactive", "dead", "success", 0  # not started, stopped, or exited 0
    if how == "running":
        active, sub = "active", "running"
    elif how == "exited" and code:
        active, sub = "failed", "failed"
        result, main = ("exit-code", code) if code > 0 else ("signal", -code)
    shown = [("ActiveState", active), ("SubState", sub), ("Result", result), ("ExecMainStatus", main)]
    return "".join(f"{name}={value}\n" for name, value in [*shown, ("NRestarts", 0)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="supervisor")
    parser.add_argument("verb", choices=["restart", "stop", "status", "show", "watch"])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--env-file", type=Path)
    parser.add_argument("--cpus", type=lambda text: {int(c) for c in text.split(",")})
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1 :]
    if args.verb == "watch":
        return watch(args.state, args.command)
    if args.verb == "status":
        how, _, line = status(args.state)
        print(line)
        return 0 if how == "running" else 1
    if args.verb == "show":
        sys.stdout.write(show(args.state))
        return 0
    args.state.mkdir(parents=True, exist_ok=True)
    # One stop or restart at a time, as systemd runs one job at a time on a unit: a test's stop
    # racing the daemon's restart would otherwise unlink the pid file of the process just started.
    with (args.state / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _restart(args)


def _restart(args: argparse.Namespace) -> int:
    stop(args.state)
    if args.verb == "stop":
        return 0
    env = read_env(args.env_file) if args.env_file and args.env_file.exists() else {}
    command = args.command
    with (args.state / "commands").open("a") as seen:  # what was started, each time
        seen.write(json.dumps({"command": command, "env": env}) + "\n")
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)  # inherited by the command: no preexec_fn needed
    # -I: the watcher imports nothing of the tests (nor of this directory), whatever the cwd
    watcher = [sys.executable, "-I", str(Path(__file__).resolve()), "watch", "--state", str(args.state), "--",
               *command]  # fmt: skip
    with (args.state / "service.log").open("ab") as log:
        process = subprocess.Popen(
            watcher,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env},
        )
    (args.state / "pid").write_text(str(process.pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
