"""The real-vLLM tier: one real vLLM 0.32.0 (CPU build) with speculative decoding, for the session.

vLLM is not in the project's venv: ``make e2e`` installs it into ``.venv-vllm`` and names that
interpreter in ``$SPECGUARD_VLLM_PYTHON``. Without it these tests skip, or fail under
``SPECGUARD_REQUIRE_REAL=1`` (see tests/real.py).

Nothing is downloaded: ``make_tiny_model.py`` builds a tiny random Llama and its tokenizer, and the
server serves it with itself as the draft model (``method: draft_model``, k = 4).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.realclient import SERVED_NAME, VllmServer  # importable through pytest's pythonpath = ["."]
from tests.real import require_vllm_python

MAKE_MODEL = Path(__file__).resolve().parent / "make_tiny_model.py"
NUM_SPECULATIVE_TOKENS = 4
MODEL_BUILD_TIMEOUT = 300.0
# Startup takes 60-70 s on 2 cores (model load, engine profiling, warm-up); leave room for a
# loaded CI machine.
STARTUP_TIMEOUT = 360.0
STOP_TIMEOUT = 30.0


def _offline_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",  # nothing may be fetched from a hub
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(root / "hf"),
        VLLM_CACHE_ROOT=str(root / "vllm-cache"),  # keyed by the model's (new) path: no reuse anyway
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


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


def _build_model(python: str, out: Path, env: dict[str, str]) -> None:
    try:
        done = subprocess.run(
            [python, str(MAKE_MODEL), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=MODEL_BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building the tiny model took over {MODEL_BUILD_TIMEOUT:.0f}s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"building the tiny model failed ({done.returncode}):\n{done.stderr[-3000:]}", pytrace=False
        )


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Poll ``/health`` until it answers 200: vLLM refuses connections until it is ready."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode} while starting:\n{_tail(log)}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # still loading: the port refuses connections
        time.sleep(1)
    pytest.fail(f"vLLM did not answer /health within {STARTUP_TIMEOUT:.0f}s:\n{_tail(log)}", pytrace=False)


def _omp_cpus() -> tuple[set[int], set[int]]:
    """(CPUs for vLLM's OpenMP worker threads, CPUs for everything else in the tier).

    vLLM's CPU worker binds its OpenMP threads to cores (``VLLM_CPU_OMP_THREADS_BIND``, by default
    all but one) and keeps them busy while it serves. A short-lived process the kernel places on such
    a core can wait there for tens of seconds (measured: ``python -c pass`` took up to 64 s on the bound
    core, under 0.01 s on the other), which is what made ``specguard eval`` time out. So the worker gets
    the last CPU and this process, with everything it starts later, keeps to the others."""
    available = os.sched_getaffinity(0)
    if len(available) < 2:
        return available, available
    worker = {max(available)}
    return worker, available - worker


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's whole process group (API server, engine core, workers), then SIGKILL."""
    group = process.pid  # start_new_session: the server leads its own group
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_TIMEOUT)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the engine core may outlive the API server briefly
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    if process.poll() is None:
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def vllm_server(
    tmp_path_factory: pytest.TempPathFactory,
    unused_tcp_port_factory: Callable[[], int],
    request: pytest.FixtureRequest,
) -> Iterator[VllmServer]:
    """A real vLLM serving the tiny model with itself as the draft, on 127.0.0.1; stopped at the end."""
    python = require_vllm_python()
    root = tmp_path_factory.mktemp("vllm")
    env = _offline_env(root)
    model_dir = root / "tiny-llama"

    started = time.monotonic()
    _build_model(python, model_dir, env)
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
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "1024",
        "--dtype", "bfloat16",
        "--speculative-config", json.dumps(speculative),
    ]  # fmt: skip
    worker_cpus, other_cpus = _omp_cpus()
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
        _wait_healthy(process, server.url, server.log)
        _report(
            request.config,
            f"e2e: vLLM ready in {time.monotonic() - built:.1f}s (OpenMP on CPU {sorted(worker_cpus)}, "
            f"tests on {sorted(other_cpus)}; log: {server.log})",
        )
        yield server
    finally:
        stopping = time.monotonic()
        _stop(process)
        os.sched_setaffinity(0, own_cpus)
        _report(request.config, f"e2e: vLLM stopped in {time.monotonic() - stopping:.1f}s")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client
