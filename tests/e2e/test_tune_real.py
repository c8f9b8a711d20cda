"""`specguard tune` on the real vLLM 0.32.0 CPU tier: the tiny Llama as its own draft at k = 5, managed
by a real specguard daemon's vllm_restart action (tests/e2e/restart_host.py, as the restart tier),
swept over k = 1, 3, 5 with rung 0 as the plain reference. The sweep completes through the daemon's
ladder API, the original k = 5 is back (the daemon's ladder, the config file and the server's own
/metrics say so), and the measured table is kept with the test's artifacts (``tune-table.txt`` in
its directory, and in the report).

Runs on its own (``make e2e`` runs it after the rest of the tier, whose server it must not share
the CPUs with): four restarts of about a minute each."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest

from specguard.actions.vllm_restart.server import positions
from tests.e2e.restart_host import HEALTH_TIMEOUT, Host, restart_host
from tests.e2e.serving import STARTUP_TIMEOUT
from tests.processes import specguard

pytestmark = pytest.mark.own_server

K = 5
RULES = """\
rules:
  - name: acceptance_critical
    signal: acceptance_rate
    window: 10s
    interval: 2s
    condition: "< 0.3"
    for: 4s
    severity: critical
    actions: [shrink]
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    with restart_host(tmp_path_factory, RULES, K, [5, 3, 1, 0]) as served:
        yield served


async def healthy(url: str, host: Host) -> float:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() - started < STARTUP_TIMEOUT:
            try:
                async with session.get(url + "/health") as answer:
                    if answer.status == 200:
                        return time.monotonic() - started
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(1)
    pytest.fail(f"vLLM not healthy within {STARTUP_TIMEOUT:.0f}s:\n{host.vllm_log()}", pytrace=False)


async def served_positions(url: str) -> set[int]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(url + "/metrics") as answer,
    ):
        return positions(await answer.text())[1]


async def test_a_sweep_over_1_3_5_completes_through_the_daemon_and_restores_k(
    host: Host, report: Callable[[str], None]
) -> None:
    subprocess.run(host.command, check=True, timeout=60)  # the first start, by the restart command
    report(f"tune tier: vLLM (k={K}) ready in {await healthy(host.url, host):.0f}s")
    host.daemon.start()
    await host.daemon.wait_for(lambda status: bool(status.get("rules")), timeout=120)
    started = time.monotonic()
    code, out, err = await specguard(
        "tune", "--config", str(host.specguard_config), "--url", host.url, "--sweep", "1,3,5",
        "--classes", "chat", "--num-prompts", "8", "--max-tokens", "32", "--concurrency", "2",
        "--warmup", "1", cwd=host.root, timeout=4 * (HEALTH_TIMEOUT * 2 + 300),
    )  # fmt: skip
    took = time.monotonic() - started
    table = host.root / "tune-table.txt"
    table.write_text(f"{out}\n{err}")
    report(f"tune tier: the sweep took {took:.0f}s; table in {table}:\n{out}\n{err}")
    assert code == 0, (out, err, host.vllm_log())
    for k in ("off", "1", "3", "5"):
        assert any(line.split()[:2] == ["chat", k] for line in out.splitlines()), out
    assert "recommended: num_speculative_tokens = " in out
    code, shown, ladder_err = await specguard(
        "ladder", "show", "--config", str(host.specguard_config), "--format", "json"
    )
    assert code == 0, ladder_err
    ladder: dict[str, Any] = json.loads(shown)[0]
    assert ladder["k"] == K == ladder["file_k"] and ladder["change"] is None, ladder
    assert [(e["from"], e["to"], e["ok"]) for e in ladder["log"]] == [
        (5, 3, True), (3, 1, True), (1, 0, True), (0, 5, True)
    ], ladder["log"]  # fmt: skip
    assert "  num_speculative_tokens: 5\n" in host.config.read_text()
    assert await served_positions(host.url) == set(range(K))
