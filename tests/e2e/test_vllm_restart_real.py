"""vllm_restart against a real vLLM 0.32.0 on the CPU: the tiny Llama served as its own draft at k = 5,
started (and restarted) by the configured restart command through tests/supervisor.py, with its
speculative config in vLLM's own YAML ``--config`` file. Three scenes, in order, on one server:

1. acceptance collapses under temperature-1.5 traffic, the rule fires, the action rewrites the
   config to k = 3 and restarts vLLM; the verification sees exactly positions 0-2; history has it;
2. the draft path in the config is broken, so the next step (by hand: ``specguard ladder down``)
   cannot come up: vLLM exits, the status command says so, and the action rolls back at once (not
   after ``health_timeout``) to the config last seen running, with its k;
3. specguard is killed (SIGKILL) while a step up restarts vLLM; started again, it completes the
   verification from its journal.

Runs on its own (``make e2e`` runs it after the rest of the tier, whose server it must not share
the CPUs with). Prints the measured times: detection, restart, verification, the broken step's rollback.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from specguard.sim.traffic import Traffic
from tests.e2e.realclient import SERVED_NAME
from tests.e2e.restart_host import (
    HEALTH_TIMEOUT,
    LADDER,
    RULES,
    Host,
    K,
    healthy,
    ladder,
    restart_host,
    served_positions,
)
from tests.processes import specguard

pytestmark = pytest.mark.own_server


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    with restart_host(tmp_path_factory, RULES, K, LADDER) as served:
        yield served


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client


async def until(what: str, check: Callable[[], Any], seconds: float, host: Host) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(1)
    pytest.fail(f"timed out ({seconds:.0f}s) waiting for: {what}\n{host.vllm_log()}", pytrace=False)


async def test_a_collapse_steps_k_down_on_the_real_server(
    host: Host, session: aiohttp.ClientSession, report: Callable[[str], None]
) -> None:
    started = time.monotonic()
    subprocess.run(host.command, check=True, timeout=60)  # the first start, by the restart command
    report(f"restart tier: vLLM (k={K}) ready in {await healthy(session, host.url, host):.0f}s")
    assert await served_positions(session, host.url) == set(range(K))
    host.daemon.start()

    traffic = Traffic(host.url, SERVED_NAME, concurrency=2, max_tokens=32, temperature=0.0)
    await traffic.start()
    try:
        await asyncio.sleep(8)  # acceptance near 1: nothing fires
        assert (await ladder(host))["log"] == []
        traffic.temperature = 1.5
        hot = time.time()

        async def fired() -> Any:
            code, out, _ = await specguard(
                "history", "--config", str(host.specguard_config), "--format", "json"
            )
            return code == 0 and [e for e in json.loads(out) if e["kind"] == "firing"]

        (firing, *_) = await until("the rule to fire", fired, 180, host)
    finally:
        await traffic.stop()
    detection = firing["at"] - hot
    done = await until("the step to k=3", lambda: _logged(host), HEALTH_TIMEOUT + 120, host)
    entry = done["log"][0]
    assert entry["ok"], entry
    assert (entry["from"], entry["to"], done["k"]) == (5, 3, 3)
    assert "/metrics counts draft positions 0-2" in entry["detail"]
    assert await served_positions(session, host.url) == {0, 1, 2}
    text = host.config.read_text()
    assert (
        "  num_speculative_tokens: 3\n" in text
        and "  method: draft_model   # the target as its own draft\n" in text
    )
    assert text.startswith("# vLLM for specguard's restart tier")
    code, out, _ = await specguard("history", "--config", str(host.specguard_config), "--format", "json")
    assert code == 0
    notes = [n["text"] for e in json.loads(out) for n in e["notes"]]
    assert any(n.startswith("k 5 -> 3 (ok, ") and '"num_speculative_tokens":3}' in n for n in notes), notes
    report(
        f"restart tier: detection {detection:.1f}s after the traffic turned hot; k 5 -> 3 took "
        f"{entry['ended'] - entry['at']:.0f}s ({entry['detail']}); scene 1 in {time.monotonic() - started:.0f}s"
    )


async def _logged(host: Host, count: int = 1) -> dict[str, Any] | None:
    shown = await ladder(host)
    return shown if len(shown["log"]) >= count and shown["change"] is None else None


async def test_a_broken_config_is_rolled_back_to_the_last_one_seen_running(
    host: Host, session: aiohttp.ClientSession, report: Callable[[str], None]
) -> None:
    before = await ladder(host)
    assert before["k"] == 3, before
    text = host.config.read_text()
    model_line = next(line for line in text.splitlines() if line.startswith("  model: "))
    host.config.write_text(text.replace(model_line, "  model: /nonexistent/draft"))  # the draft path broken
    started = time.monotonic()
    code, out, err = await specguard("ladder", "down", "--config", str(host.specguard_config),
                                     timeout=HEALTH_TIMEOUT * 2 + 300)  # fmt: skip
    took = time.monotonic() - started
    # vLLM refuses the config and exits: the wait for /health ends there, not after HEALTH_TIMEOUT
    ended = re.match(
        r"failed: k 3 -> 1 failed at verify: the server is down \(status_command: exited with status \d+ "
        r"after \d+s\) (\d+)s after the restart; ",
        out,
    )
    assert code == 1 and ended, (out, err)
    assert "rolled back to k=3: /metrics counts draft positions 0-2" in out, out
    assert await served_positions(session, host.url) == {0, 1, 2}
    assert model_line in host.config.read_text() and "/nonexistent" not in host.config.read_text()
    shown = await ladder(host)
    assert shown["k"] == 3 and shown["log"][-1]["ok"] is False
    report(
        f"restart tier: the broken step and its rollback took {took:.0f}s (vLLM exited {ended[1]}s after "
        f"the restart, which ended the wait for /health; health_timeout {HEALTH_TIMEOUT:g}s)"
    )


async def test_a_restart_cut_short_by_a_kill_is_verified_by_the_next_specguard(
    host: Host, session: aiohttp.ClientSession, report: Callable[[str], None]
) -> None:
    assert (await ladder(host))["k"] == 3
    started = time.monotonic()
    asking = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard", "ladder", "up", "--config", str(host.specguard_config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def restarting() -> Any:
        change = (await ladder(host))["change"]
        return change is not None and change["phase"] == "verify"

    await until("the step up to restart vLLM", restarting, 120, host)
    assert host.daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    await asking.communicate()  # its answer is lost with the daemon
    assert (await ladder(host))["change"]["phase"] == "verify"

    host.daemon.start()
    done = await until("the verification, completed", lambda: _logged(host, 3), HEALTH_TIMEOUT + 120, host)
    entry = done["log"][-1]
    assert entry["ok"] and (entry["from"], entry["to"], done["k"]) == (3, 5, 5), entry
    assert "completed after specguard restarted" in entry["detail"]
    assert await served_positions(session, host.url) == set(range(5))
    report(
        f"restart tier: killed mid-restart, verified by the next specguard; {time.monotonic() - started:.0f}s"
    )
