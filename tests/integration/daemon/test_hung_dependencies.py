"""Actions never run inside the evaluation round: `specguard run` in its own process, on a 1 s
interval, scrapes a healthy simulated vLLM while one feature flag's API never answers (the HTTP
backend at its defaults: 10 s per request, 3 retries), another flag's canary never answers, and
neither does Slack. All hang at once, and for as long as they do the rules keep their schedule,
/healthz answers 200, and the "skipped a round" line comes at most once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.sim.options import SimOptions
from specguard.sim.server import Simulator, start_simulator
from tests.hostile_deps import HostileDeps
from tests.ports import free_port
from tests.processes import Daemon

OBSERVE = 20.0  # seconds both dependencies are watched hung (the flag API's engage lasts ~47 s)
MAX_GAP = 6.0  # seconds between two rounds at most: a hang guard for a 1 s interval on a loaded machine

RULES = """\
rules:
  # fires on the first reading (a simulator always has a running-requests gauge): engages api_flag
  # and tells on-call
  - {name: always, signal: running_requests, window: 3s, interval: 1s, condition: ">= 0",
     actions: [api_flag, oncall]}
  # fires while the test keeps a request running, resolves when it stops: engages, then restores
  # file_flag, whose canary is asked first (a window of three scrapes: one scrape's window can
  # hold none when a scrape comes late)
  - {name: busy, signal: running_requests, window: 3s, interval: 1s, condition: "> 0",
     actions: [file_flag]}
"""


def config(directory: Path, port: int, sim: Simulator, deps: HostileDeps) -> Path:
    (directory / "rules.yaml").write_text(RULES)
    (directory / "slack-token").write_text("xoxb-hostile")
    path = directory / "specguard.yaml"
    path.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\nrules: [rules.yaml]\n"
        f"sources: {{scrape: {{targets: [{sim.url}/metrics]}}}}\n"
        "actions:\n"
        "  api_flag:\n    type: feature_flag\n"
        f"    http: {{url: '{deps.url('/flag/spec')}', engage: {{speculative: false}}, "
        "restore: {speculative: true}, request_timeout: 10s, retries: 3}\n"
        "  file_flag:\n    type: feature_flag\n    quiet_period: 0s\n"
        f"    file: {{path: {directory / 'flag.json'}, engage: {{speculative: false}}, "
        "restore: {speculative: true}}\n"
        f"    canary: {{url: '{deps.url('/vllm')}', min_acceptance: 0.5, timeout: 60s}}\n"
        "  oncall:\n    type: slack\n    token: {file: slack-token}\n    channel: C0ONCALL\n"
        f"    base_url: '{deps.url('/slack/api/')}'\n    group_wait: 0s\n"
    )
    return path


@contextlib.asynccontextmanager
async def busy(sim: Simulator) -> AsyncIterator[None]:
    """Keeps one request running at the simulator, one after the other, until left."""

    async def loop() -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 100, "ignore_eos": True}
                async with session.post(f"{sim.url}/v1/completions", json=body) as answer:
                    await answer.read()

    task = asyncio.ensure_future(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def rule_state(status: dict[str, Any], rule: str) -> str | None:
    return next((row.get("state") for row in status["rules"] if row["rule"] == rule), None)


async def until(what: str, check: Any, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.1)


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    simulator = await start_simulator(SimOptions(port=free_port(), step_time=0.02, seed=5))
    try:
        yield simulator
    finally:
        await simulator.stop()


async def test_a_hung_flag_api_and_a_hung_canary_hold_no_round(tmp_path: Path, sim: Simulator) -> None:
    with HostileDeps() as deps:
        deps.set("/flag", "hang")
        deps.set("/vllm", "hang")
        deps.set("/slack", "hang")
        port = free_port()
        daemon = Daemon(config(tmp_path, port, sim, deps), port, tmp_path / "specguard.log")
        daemon.start()
        try:
            async with busy(sim):
                await daemon.wait_for(lambda s: rule_state(s, "busy") == "firing", timeout=60)
                await until("the flag file engaged", lambda: "false" in _read(tmp_path / "flag.json"))
            await daemon.wait_for(lambda s: rule_state(s, "busy") != "firing", timeout=60)
            await until("the canary asked", lambda: deps.count("/vllm/v1/models") > 0)
            await until("the flag API asked", lambda: deps.count("/flag/spec", "PUT") > 0)
            await until("Slack asked", lambda: deps.count("/slack/api/chat.postMessage") > 0)
            # All hang now: the flag API's engage for ~47 s, the canary for 60 s, Slack for 10 s a try.
            rounds, refused = await _watch(daemon, OBSERVE)
        finally:
            await _stop(daemon)
        assert sum(deps.served.values()) == 0, (
            "a dependency answered while it was to hang: the test watched nothing"
        )
    assert_schedule_held(daemon, rounds, refused, OBSERVE)


def assert_schedule_held(daemon: Daemon, rounds: list[float], refused: list[Any], observe: float) -> None:
    """While its dependencies misbehaved for ``observe`` seconds, the daemon answered /healthz,
    kept its rounds at most MAX_GAP apart, and skipped at most one round (one overrun episode)."""
    assert not refused, f"/healthz did not answer 200 while the dependencies misbehaved: {refused[:5]}"
    gaps = [b - a for a, b in itertools.pairwise(rounds)]
    assert len(rounds) >= observe / MAX_GAP, f"rounds seen while the dependencies misbehaved: {rounds}"
    assert max(gaps) <= MAX_GAP, f"a round came {max(gaps):.1f} s after the one before: {gaps}"
    print(f"{len(rounds)} rounds in {observe:g} s, gaps up to {max(gaps):.1f} s")
    logs = daemon.logs()
    assert logs and all("msg" in line for line in logs)  # the daemon's JSON lines, read as they are
    skipped = [line for line in logs if "skipped a round" in line["msg"]]
    assert len(skipped) <= 1, f"{len(skipped)} 'skipped a round' lines: {skipped[:3]}"


async def _stop(daemon: Daemon) -> None:
    """SIGTERM, and its end awaited: a flag's change under way gets the daemon's grace (20 s) to
    finish before it is cut off, so the stop takes that long here."""
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(daemon.process.wait, 90)
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


async def _watch(daemon: Daemon, seconds: float) -> tuple[list[float], list[str]]:
    """Poll /healthz and /api/status for ``seconds``: the rounds' ends seen (``last_evaluation``,
    on the test's clock: when a new one was first seen), and what /healthz said other than 200."""
    rounds: list[float] = []
    refused: list[str] = []
    last: float | None = None
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            status, body = await daemon.get("/healthz", timeout=10)
            if status != 200:
                refused.append(f"{status}: {body}")
            status, body = await daemon.get("/api/status", timeout=10)
        except (TimeoutError, aiohttp.ClientError) as exc:
            refused.append(f"{type(exc).__name__}: {exc}")
            continue
        if status == 200 and body.get("last_evaluation") != last:
            last = body.get("last_evaluation")
            rounds.append(time.monotonic())
        await asyncio.sleep(0.25)
    return rounds, refused
