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
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.actions.vllm_restart.server import positions
from specguard.sim.traffic import Traffic
from tests.e2e.realclient import SERVED_NAME
from tests.e2e.serving import STARTUP_TIMEOUT, build_model, offline_env, omp_cpus, tail
from tests.ports import free_port
from tests.processes import Daemon, specguard
from tests.real import require_vllm_python

pytestmark = pytest.mark.own_server

K = 5
HEALTH_TIMEOUT = STARTUP_TIMEOUT  # a start on a loaded 2-core machine (a broken one ends at once)
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


@dataclass
class Host:
    root: Path
    url: str
    config: Path  # vLLM's YAML --config
    command: list[str]  # the restart command the action runs
    state: Path  # the supervisor's
    specguard_config: Path
    daemon: Daemon

    def vllm_log(self) -> str:
        log = self.state / "service.log"
        return tail(log) if log.exists() else "(no vLLM log)"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Host]:
    python = require_vllm_python()
    root = tmp_path_factory.mktemp("restart")
    env = offline_env(root)
    model = root / "tiny-llama"
    build_model(python, model, env)
    port = free_port()
    config = root / "vllm.yaml"
    config.write_text(
        "# vLLM for specguard's restart tier: options as on the command line, without the dashes\n"
        f"model: {model}\n"
        f"served-model-name: {SERVED_NAME}\n"
        "host: 127.0.0.1\n"
        f"port: {port}\n"
        "max-model-len: 1024\n"
        "dtype: bfloat16\n"
        "speculative-config:\n"
        "  method: draft_model   # the target as its own draft\n"
        f"  model: {model}\n"
        f"  num_speculative_tokens: {K}\n"
    )
    state = root / "service"
    worker_cpus, other_cpus = omp_cpus()
    # vLLM's processes may use every CPU, as in the rest of the tier, but for the worker's OpenMP
    # threads (bound below): not this process's CPUs, which would keep its engine core, busy while
    # it serves, on the CPU the daemon and the commands run on. There they waited for it up to
    # 100 s (measured: the daemon's start, and `ladder show` killed after 120 s).
    every_cpu = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    command = [sys.executable, "-m", "tests.supervisor", "restart", "--state", str(state), "--cpus", every_cpu,
               "--", python, "-m", "vllm.entrypoints.openai.api_server", "--config", str(config)]  # fmt: skip
    status_command = [sys.executable, "-m", "tests.supervisor", "status", "--state", str(state)]
    env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(worker_cpus)))
    saved = dict(os.environ)
    os.environ.update(env)  # what the daemon, the supervisor and vLLM inherit
    own_cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, other_cpus)
    specguard_port = free_port()
    (root / "rules.yaml").write_text(RULES)
    action = {
        "type": "vllm_restart", "ladder": [5, 3, 1, 0], "url": f"http://127.0.0.1:{port}",
        "vllm_config": {"path": str(config)}, "command": command, "status_command": status_command,
        "health_timeout": f"{HEALTH_TIMEOUT:g}s",
    }  # fmt: skip
    specguard_config = root / "specguard.yaml"
    specguard_config.write_text(
        json.dumps({
            "server": {"port": specguard_port}, "state_dir": "state", "interval": "2s", "rules": ["rules.yaml"],
            "sources": {"scrape": {"targets": [f"http://127.0.0.1:{port}/metrics"], "timeout": "5s"}},
            "actions": {"shrink": action},
        })
    )  # fmt: skip
    served = Host(root, f"http://127.0.0.1:{port}", config, command, state, specguard_config,
                  Daemon(specguard_config, specguard_port, root / "specguard.log"))  # fmt: skip
    try:
        yield served
    finally:
        if served.daemon.process is not None and served.daemon.process.poll() is None:
            served.daemon.stop()
        subprocess.run([sys.executable, "-m", "tests.supervisor", "stop", "--state", str(state)], timeout=120)
        os.environ.clear()
        os.environ.update(saved)
        os.sched_setaffinity(0, own_cpus)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        yield client


async def healthy(
    session: aiohttp.ClientSession, url: str, host: Host, seconds: float = STARTUP_TIMEOUT
) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            async with session.get(url + "/health") as answer:
                if answer.status == 200:
                    return time.monotonic() - started
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(1)
    pytest.fail(f"vLLM not healthy within {seconds:.0f}s:\n{host.vllm_log()}", pytrace=False)


async def served_positions(session: aiohttp.ClientSession, url: str) -> set[int]:
    async with session.get(url + "/metrics") as answer:
        return positions(await answer.text())[1]


async def ladder(host: Host) -> dict[str, Any]:
    code, out, err = await specguard(
        "ladder", "show", "--config", str(host.specguard_config), "--format", "json"
    )
    assert code == 0, err
    shown: dict[str, Any] = json.loads(out)[0]
    return shown


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
