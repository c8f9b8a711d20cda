"""Starting and stopping a real vLLM for the e2e tier: an offline environment, the tiny model built
locally, the wait for /health, the CPUs its OpenMP threads get, a clean stop of its process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

MAKE_MODEL = Path(__file__).resolve().parent / "make_tiny_model.py"
MODEL_BUILD_TIMEOUT = 300.0
# Startup takes 60-70 s on 2 cores (model load, engine profiling, warm-up); leave room for a
# loaded CI machine.
STARTUP_TIMEOUT = 360.0
STOP_TIMEOUT = 30.0


def offline_env(root: Path) -> dict[str, str]:
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


def serve_command(
    python: str, model: Path, port: int, speculative: dict[str, Any], served_name: str | None = None
) -> list[str]:
    """vLLM's OpenAI server on loopback for the tiny model: the options every e2e server shares."""
    named = ["--served-model-name", served_name] if served_name else []
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), *named,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "1024",
        "--dtype", "bfloat16",
        "--speculative-config", json.dumps(speculative),
    ]  # fmt: skip


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def build_model(python: str, out: Path, env: dict[str, str], vocab_size: int | None = None) -> None:
    """The tiny Llama of make_tiny_model.py in ``out`` (with a vocabulary of ``vocab_size``, not 512)."""
    try:
        done = subprocess.run(
            [python, str(MAKE_MODEL), str(out), *([str(vocab_size)] if vocab_size is not None else [])],
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


def wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Poll ``/health`` until it answers 200: vLLM refuses connections until it is ready."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode} while starting:\n{tail(log)}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # still loading: the port refuses connections
        time.sleep(1)
    pytest.fail(f"vLLM did not answer /health within {STARTUP_TIMEOUT:.0f}s:\n{tail(log)}", pytrace=False)


def omp_cpus() -> tuple[set[int], set[int]]:
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


def stop(process: subprocess.Popen[bytes]) -> None:
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
