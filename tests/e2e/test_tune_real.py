"""`specguard tune` on the real vLLM 0.32.0 CPU tier: the tiny Llama as its own draft at k = 5, managed
by a real specguard daemon's vllm_restart action (tests/e2e/restart_host.py, as the restart tier),
swept over k = 1, 3, 5 with rung 0 as the plain reference. The sweep completes through the daemon's
ladder API, the original k = 5 is back (the daemon's ladder, the config file and the server's own
/metrics say so), and the measured table is kept with the test's artifacts (``tune-table.txt`` in
its directory, and in the report).

Runs on its own (``make e2e`` runs it after the rest of the tier, whose server it must not share
the CPUs with): four restarts of about a minute each."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator

import aiohttp
import pytest

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


async def test_a_sweep_over_1_3_5_completes_through_the_daemon_and_restores_k(
    host: Host, report: Callable[[str], None]
) -> None:
    subprocess.run(host.command, check=True, timeout=60)  # the first start, by the restart command
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        report(f"tune tier: vLLM (k={K}) ready in {await healthy(session, host.url, host):.0f}s")
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
    shown = await ladder(host)
    assert shown["k"] == K == shown["file_k"] and shown["change"] is None, shown
    assert [(e["from"], e["to"], e["ok"]) for e in shown["log"]] == [
        (5, 3, True), (3, 1, True), (1, 0, True), (0, 5, True)
    ], shown["log"]  # fmt: skip
    assert "  num_speculative_tokens: 5\n" in host.config.read_text()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        assert await served_positions(session, host.url) == set(range(K))
