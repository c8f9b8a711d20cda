"""The restarted server's process, watched while specguard waits for ``/health``, so that a start
that fails (vLLM refusing its config) ends the wait at once instead of after ``health_timeout``.

With ``unit``, systemd's record of the unit (``systemctl show``): failed, stopped, or failed and
being started again by systemd (``Restart=``). With ``command``, which returns once it has asked for
the restart (as ``systemctl restart`` does for a simple service) and so says nothing about the
server afterwards, the optional ``status_command``: exit status 0 while the server's process runs
(loading included), anything else once it has stopped. A watch that cannot tell (systemctl or the
status command not answering) ends nothing: ``/health`` and the timeout decide, as without one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

log = logging.getLogger("specguard.action.vllm_restart")

# What one look at the process may take: systemctl answers in milliseconds; a look that hangs is
# "cannot tell", never "down".
LOOK_TIMEOUT = 10.0
QUOTE = 200  # how much of the status command's output a reason quotes
UNIT_PROPERTIES = ("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts")

# None while the process runs (or nothing can be told), else why it is down.
Watch = Callable[[], Awaitable[str | None]]


async def _look(argv: Sequence[str]) -> tuple[int, str]:
    """Run ``argv`` (no shell): (exit status, output). Raises OSError or TimeoutError when it cannot
    run or does not answer within LOOK_TIMEOUT."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(LOOK_TIMEOUT):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return int(process.returncode or 0), output.decode("utf-8", "replace")


def unit_properties(text: str) -> dict[str, str]:
    """``systemctl show``'s ``Name=value`` lines."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, equals, value = line.partition("=")
        if equals:
            found[name.strip()] = value.strip()
    return found


def unit_down(unit: str, properties: Mapping[str, str], restarts_before: int | None) -> str | None:
    """Why ``unit`` is down after specguard restarted it, or None while it runs or starts.

    ``restarts_before``: its ``NRestarts`` when the watch began; more since means systemd started it
    again after a failure (with a short ``RestartSec=`` the failed state may last too short a time
    to be seen)."""
    active = properties.get("ActiveState", "")
    sub = properties.get("SubState", "")
    result = properties.get("Result", "")
    status = properties.get("ExecMainStatus", "")
    how = f"Result={result}"
    if status not in ("", "0") and result in ("exit-code", "signal", "core-dump"):
        how += f", {'status' if result == 'exit-code' else 'signal'} {status}"
    if active == "failed":
        return f"{unit} failed ({how})"
    if sub == "auto-restart":
        return f"{unit} failed ({how}); systemd is to start it again (Restart=)"
    if active == "inactive":
        return f"{unit} is inactive ({how})"
    restarts = properties.get("NRestarts", "")
    if restarts_before is not None and restarts.isdigit() and int(restarts) > restarts_before:
        return f"{unit} failed and systemd started it again (NRestarts {restarts_before} -> {restarts})"
    return None


class UnitWatch:
    """``systemctl show`` of the unit, at each look."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.argv = ("systemctl", "show", "--property=" + ",".join(UNIT_PROPERTIES), unit)
        self._restarts: int | None = None
        self._first = True
        self._told = False

    async def __call__(self) -> str | None:
        try:
            code, output = await _look(self.argv)
        except (OSError, TimeoutError) as exc:
            self._cannot_tell(f"{type(exc).__name__}: {exc}")
            return None
        if code != 0:
            self._cannot_tell(f"systemctl show exited with {code}: {output.strip()[-QUOTE:]}")
            return None
        properties = unit_properties(output)
        if self._first:
            self._first = False
            restarts = properties.get("NRestarts", "")
            self._restarts = int(restarts) if restarts.isdigit() else None
        return unit_down(self.unit, properties, self._restarts)

    def _cannot_tell(self, why: str) -> None:
        if not self._told:
            self._told = True
            log.warning("cannot read %s's state (%s): waiting for /health alone", self.unit, why)


class StatusCommandWatch:
    """The configured status command, at each look: 0 while the server runs."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)
        self._told = False

    async def __call__(self) -> str | None:
        try:
            code, output = await _look(self.argv)
        except (OSError, TimeoutError) as exc:
            if not self._told:
                self._told = True
                log.warning(
                    "status_command %s did not answer (%s): waiting for /health alone",
                    " ".join(self.argv), f"{type(exc).__name__}: {exc}",
                )  # fmt: skip
            return None
        if code == 0:
            return None
        said = "; ".join(line.strip() for line in output.strip().splitlines() if line.strip())[-QUOTE:]
        return f"the server is down (status_command: {said or f'exit status {code}'})"
