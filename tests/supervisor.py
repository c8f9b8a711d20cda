"""A stand-in for systemd where the tests restart a server: ``restart`` stops the process it started
last (SIGTERM, then SIGKILL after a grace) and starts the command again, detached, returning at
once as ``systemctl restart`` does for a simple service, with the variables of an environment file
(``EnvironmentFile=``) in its environment. Like systemd/vllm.service, a command that needs them on
its command line goes through ``/bin/sh -c``.

    python -m tests.supervisor restart --state DIR [--env-file FILE] [--cpus LIST] -- COMMAND...
    python -m tests.supervisor stop --state DIR

``--cpus``: the CPUs the command may run on (as systemd's ``CPUAffinity=``), whatever CPUs this
script runs on; by default the command inherits this script's.
"""

from __future__ import annotations

import argparse
import contextlib
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
    pid_file = state / "pid"
    try:
        pid = int(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and not _gone(pid):
            os.killpg(pid, 0)  # raises once the group is gone
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped (this script is not its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="supervisor")
    parser.add_argument("verb", choices=["restart", "stop"])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--env-file", type=Path)
    parser.add_argument("--cpus", type=lambda text: {int(c) for c in text.split(",")})
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1 :]
    args.state.mkdir(parents=True, exist_ok=True)
    stop(args.state)
    if args.verb == "stop":
        return 0
    env = read_env(args.env_file) if args.env_file and args.env_file.exists() else {}
    command = args.command
    with (args.state / "commands").open("a") as seen:  # what was started, each time
        seen.write(json.dumps({"command": command, "env": env}) + "\n")
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)  # inherited by the command: no preexec_fn needed
    with (args.state / "service.log").open("ab") as log:
        process = subprocess.Popen(
            command,
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
