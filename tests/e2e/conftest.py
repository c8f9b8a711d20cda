"""The real-vLLM tier: one real vLLM 0.32.0 (CPU build) with speculative decoding, for the session.

vLLM is not in the project's venv: ``make e2e`` installs it into ``.venv-vllm`` and names that
interpreter in ``$SPECGUARD_VLLM_PYTHON``. Without it these tests skip, or fail under
``SPECGUARD_REQUIRE_REAL=1`` (see tests/real.py).

Nothing is downloaded: ``make_tiny_model.py`` builds a tiny random Llama and its tokenizer, and the
server serves it with itself as the draft model (``method: draft_model``, k = 4).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest

from tests.e2e.realclient import SERVED_NAME, VllmServer  # importable through pytest's pythonpath = ["."]
from tests.e2e.serving import build_model, offline_env, omp_cpus, serve_command, stop, wait_healthy
from tests.real import require_vllm_python

NUM_SPECULATIVE_TOKENS = 4


def _report(config: pytest.Config, line: str) -> None:
    """Write ``line`` to the terminal now, past pytest's output capture (timings, measured values)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Tell the person running the tier something measured (shown even without ``-s``)."""
    return lambda line: _report(request.config, f"e2e: {line}")


@pytest.fixture(scope="session")
def vllm_server(
    tmp_path_factory: pytest.TempPathFactory,
    unused_tcp_port_factory: Callable[[], int],
    request: pytest.FixtureRequest,
) -> Iterator[VllmServer]:
    """A real vLLM serving the tiny model with itself as the draft, on 127.0.0.1; stopped at the end."""
    python = require_vllm_python()
    root = tmp_path_factory.mktemp("vllm")
    env = offline_env(root)
    model_dir = root / "tiny-llama"

    started = time.monotonic()
    build_model(python, model_dir, env)
    built = time.monotonic()
    _report(request.config, f"e2e: tiny model built in {built - started:.1f}s")

    port = unused_tcp_port_factory()
    server = VllmServer(
        url=f"http://127.0.0.1:{port}",
        port=port,
        model=SERVED_NAME,
        model_dir=model_dir,
        log=root / "vllm.log",
        num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
    )
    speculative = {
        "model": str(model_dir),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "method": "draft_model",
    }
    command = serve_command(python, model_dir, port, speculative, SERVED_NAME)
    worker_cpus, other_cpus = omp_cpus()
    env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(worker_cpus)))
    own_cpus = os.sched_getaffinity(0)
    with server.log.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=root,
            start_new_session=True,  # its own process group, so teardown reaches the engine core too
        )
    os.sched_setaffinity(0, other_cpus)  # after the launch: vLLM's other processes may use every CPU
    try:
        wait_healthy(process, server.url, server.log)
        _report(
            request.config,
            f"e2e: vLLM ready in {time.monotonic() - built:.1f}s (OpenMP on CPU {sorted(worker_cpus)}, "
            f"tests on {sorted(other_cpus)}; log: {server.log})",
        )
        yield server
    finally:
        stopping = time.monotonic()
        stop(process)
        os.sched_setaffinity(0, own_cpus)
        _report(request.config, f"e2e: vLLM stopped in {time.monotonic() - stopping:.1f}s")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client
