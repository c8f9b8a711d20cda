"""A stand-in for systemd where the tests restart a server: ``restart`` stops the process it started
last (SIGTERM, then SIGKILL after a grace) and starts the command again, detached, returning at
once as ``systemctl restart`` does for a simple service. The command line is expanded from an
environment file as systemd's ExecStart expands it: ``$VAR`` unbraced is split at whitespace into
zero or more arguments, ``${VAR}`` is one argument.

    python -m tests.supervisor restart --state DIR [--env-file FILE] -- COMMAND...
    python -m tests.supervisor stop --state DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE = 20.0


def read_env(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        words = shlex.split(value)
        values[name.strip()] = words[0] if words else ""
    return values


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    out: list[str] = []
    for word in argv:
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            out.extend(env.get(whole[1], "").split())
            continue
        out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m[1], ""), word))
    return out


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
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1 :]
    args.state.mkdir(parents=True, exist_ok=True)
    stop(args.state)
    if args.verb == "stop":
        return 0
    env = read_env(args.env_file) if args.env_file and args.env_file.exists() else {}
    command = expand(args.command, env)
    (args.state / "commands").open("a").write(" ".join(command) + "\n")
    with (args.state / "service.log").open("ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    (args.state / "pid").write_text(str(process.pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
