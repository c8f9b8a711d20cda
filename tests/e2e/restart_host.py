"""A serving host for the real-vLLM restart tier: the tiny Llama served as its own draft, started (and
restarted) by the restart command through tests/supervisor.py with its speculative config in vLLM's
own YAML ``--config`` file, and a specguard daemon (not started) whose vllm_restart action manages it.
Shared by tests/e2e/test_vllm_restart_real.py and tests/e2e/test_tune_real.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.actions.vllm_restart.server import positions
from tests.e2e.realclient import SERVED_NAME
from tests.e2e.serving import STARTUP_TIMEOUT, build_model, offline_env, omp_cpus, tail
from tests.ports import free_port
from tests.processes import Daemon, specguard
from tests.real import require_vllm_python

HEALTH_TIMEOUT = STARTUP_TIMEOUT  # a start on a loaded 2-core machine (a broken one ends at once)
K = 5  # the k vLLM starts with
LADDER = [5, 3, 1, 0]
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


@contextmanager
def restart_host(
    tmp_path_factory: pytest.TempPathFactory, rules: str, k: int, ladder: list[int]
) -> Iterator[Host]:
    """The host, vLLM not started yet (the restart command's first run starts it), at ``k``."""
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
        f"  num_speculative_tokens: {k}\n"
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
    (root / "rules.yaml").write_text(rules)
    action = {
        "type": "vllm_restart", "ladder": ladder, "url": f"http://127.0.0.1:{port}",
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


async def healthy(
    session: aiohttp.ClientSession, url: str, host: Host, seconds: float = STARTUP_TIMEOUT
) -> float:
    """Seconds until vLLM's /health answers 200; the test fails with vLLM's log after ``seconds``."""
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
    """The draft positions vLLM's /metrics counts: 0 .. k-1."""
    async with session.get(url + "/metrics") as answer:
        return positions(await answer.text())[1]


async def ladder(host: Host) -> dict[str, Any]:
    """``specguard ladder show --format json`` of the host's one action."""
    code, out, err = await specguard(
        "ladder", "show", "--config", str(host.specguard_config), "--format", "json"
    )
    assert code == 0, err
    shown: dict[str, Any] = json.loads(out)[0]
    return shown
