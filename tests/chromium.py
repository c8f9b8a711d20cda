"""Debian's headless Chromium for tests of pages a server in the test's own process serves: run
without blocking the event loop (the server must answer while the browser loads), its console
read from its log, as tests/integration/report/test_report_chromium.py reads the report's.

Screenshots go to ``$SPECGUARD_ARTIFACTS`` (default ``tests/artifacts/``), kept for a person to
look at; the directory is not cleaned up and not committed.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

ARTIFACTS = Path(os.environ.get("SPECGUARD_ARTIFACTS") or Path(__file__).parent / "artifacts")
PNG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Loaded:
    dom: str  # the page's DOM once loaded (--dump-dom), or "" for a screenshot
    console: list[str]  # the page's console messages and uncaught errors


async def chromium(binary: str, profile: Path, *arguments: str, timeout: float = 90.0) -> Loaded:
    """Headless Chromium with a profile of its own; as root it needs --no-sandbox. The console's
    messages go to stderr (--enable-logging) so the test can see them."""
    process = await asyncio.create_subprocess_exec(
        binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr",
        "--v=0", f"--user-data-dir={profile}", *arguments,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(
            f"chromium {' '.join(arguments)} still running after {timeout:.0f} s; killed"
        ) from None
    stderr = err.decode(errors="replace")
    assert process.returncode == 0, f"chromium exited {process.returncode}: {stderr[-3000:]}"
    return Loaded(out.decode(errors="replace"), console(stderr))


def console(stderr: str) -> list[str]:
    """The page's console messages in Chromium's log (it logs them all as INFO:CONSOLE, errors
    included), and uncaught errors; not its usual D-Bus and GPU complaints."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
