"""Commands specguard runs (a router's reload, a supervisor's restart): an argument list, never a
shell, with a timeout, and the end of its output when it fails."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

QUOTE = 200  # how much of a failed command's output is quoted


class CommandError(Exception):
    """The command could not run, failed or outlived its timeout; the message says which."""


async def run_command(argv: Sequence[str], timeout: float, what: str) -> str:
    """Run ``argv`` (no shell); returns a line saying so. Raises CommandError with its exit status
    and the end of its output when it fails or outlives ``timeout``."""
    shown = " ".join(argv)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise CommandError(f"{what}: cannot run {shown}: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(timeout):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise CommandError(f"{what}: {shown} did not finish within {timeout:g}s; killed") from None
    if process.returncode != 0:
        tail = output.decode("utf-8", "replace").strip()[-QUOTE:]
        raise CommandError(
            f"{what}: {shown} exited with {process.returncode}" + (f": {tail}" if tail else "")
        )
    return f"ran {shown}"
