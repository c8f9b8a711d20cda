"""specguard in its own process, as an operator runs it: one-shot commands and the daemon.

Shared by the integration tier and the real-vLLM tier. Nothing started here outlives a test: a command
that overruns is killed, a daemon that does not stop on its signal is killed and reaped.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest


async def specguard(
    *args: str, cwd: Path | None = None, timeout: float = 120.0, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``specguard ARGS`` to its end: (exit code, stdout, stderr). ``env``: its whole environment
    (default: the test's).

    On timeout the process is killed and the test fails with what it printed."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd,
        env=None if env is None else dict(env),
    )  # fmt: skip
    communicate = asyncio.ensure_future(process.communicate())
    done, _ = await asyncio.wait({communicate}, timeout=timeout)
    if not done:
        process.kill()
        out, err = await communicate
        pytest.fail(
            f"specguard {' '.join(args)} still running after {timeout:.0f} s; killed. "
            f"stdout: {out.decode()[-2000:]!r} stderr: {err.decode()[-4000:]!r}"
        )
    out, err = communicate.result()
    assert process.returncode is not None
    print(f"specguard {' '.join(args)}: {time.monotonic() - started:.1f} s")  # shown with a failure
    return process.returncode, out.decode(), err.decode()


class Daemon:
    """One `specguard run` process, its JSON log in a file, polled through its HTTP server."""

    def __init__(
        self, config: Path, port: int, log: Path, program: Sequence[str] = (sys.executable, "-m", "specguard")
    ):
        """``program``: how specguard is started (this tree's, by default; an installed one's path)."""
        self.config, self.port, self.log = config, port, log
        self.program = list(program)
        self.process: subprocess.Popen[bytes] | None = None
        self.polls: list[float] = []  # seconds each status poll waited for its answer (or timed out)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(
        self,
        *args: str,
        output: int | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Start `specguard run` with ``args`` added; its output goes to the log file, or to the file
        descriptor ``output``; ``env``: its whole environment (default: the test's)."""
        command = [
            *self.program,
            "run",
            "--config",
            str(self.config),
            "--log-format",
            "json",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*command, *args],
                stdout=log if output is None else output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
                cwd=cwd,
            )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` and return the exit code; killed (and reaped) if it has not exited in 15 s."""
        assert self.process is not None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=15)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def logs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    async def get(self, path: str, timeout: float = 10) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(self.url + path) as response,
        ):
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()

    async def wait_for(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 20,
        check: Callable[[], None] = lambda: None,
        explain: Callable[[], Awaitable[str]] | None = None,
    ) -> dict[str, Any]:
        """Poll /api/status until ``predicate`` holds for it; ``check`` runs before each poll (it may
        raise to end the wait early, as a traffic loop that failed does). On timeout the failure
        says what the polls met, how the wall clock moved against the monotonic one, and what
        ``explain`` says (what the test's other parts saw, such as the server's counters)."""
        began, began_wall = time.monotonic(), time.time()
        deadline = began + timeout
        last: Any = None
        answered_at: float | None = None  # seconds into the wait of the last answer
        refused, refusal = 0, ""
        while time.monotonic() < deadline:
            check()
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"specguard exited with {self.process.returncode}:\n{self.log.read_text()}")
            asked = time.monotonic()
            answer: tuple[int, Any] | None = None
            try:
                answer = await self.get("/api/status", timeout=max(1.0, min(10.0, deadline - asked)))
            except TimeoutError:
                # Not yet, rather than a failure: the daemon shares a CPU with vLLM's engine core in
                # the real-vLLM tier, and answered there in up to 2.4 s (measured).
                pass
            except aiohttp.ClientError as exc:
                refused, refusal = refused + 1, f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.2)  # not listening yet
                continue
            self.polls.append(time.monotonic() - asked)
            if answer is None:
                last = f"no answer in {self.polls[-1]:.1f} s"
            else:
                status, last = answer
                answered_at = time.monotonic() - began
                if status == 200 and predicate(last):
                    return dict(last)
            await asyncio.sleep(0.2)
        waited, wall = time.monotonic() - began, time.time() - began_wall
        seen = (
            "never answered"
            if answered_at is None
            else f"the last answer came {answered_at:.1f} s into the wait"
        )
        said = ""
        if explain is not None:
            try:
                said = "\n" + await explain()
            except Exception as exc:  # the failure is the daemon's; what could not be told is said
                said = f"\n(could not tell more: {type(exc).__name__}: {exc})"
        pytest.fail(
            f"status never matched in {timeout:.0f} s; last: {last}; slowest poll {max(self.polls, default=0):.1f} s; "
            f"{seen}; {refused} polls failed to connect{f' (last: {refusal})' if refused else ''}; "
            f"the wall clock moved {wall:.1f} s in {waited:.1f} s{said}"
            f"\nlog:\n{self.log.read_text()[-3000:]}"
        )
