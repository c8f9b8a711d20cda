"""A command `specguard serve-config` generated for vLLM 0.32.0 serves: the tiny Llama as its own
draft at k = 3, started from the ``command.sh`` that ``--out`` wrote (offline, on the CPU, as the
tier's own server is started), healthy, listed by /v1/models, and with vLLM's speculative metrics
carrying exactly the configured k: positions 0..2 of the per-position counter, and drafts counted
for a request. Starts a vLLM of its own, so it runs apart from the tier's shared server.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from specguard.cli.entry import main
from tests.e2e.realclient import spec_counters
from tests.e2e.serving import build_model, offline_env, omp_cpus, stop, tail, wait_healthy
from tests.ports import free_port
from tests.real import require_vllm_python

pytestmark = pytest.mark.own_server

K = 3
SERVED = "tiny-served"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return str(response.read().decode())


def _complete(url: str) -> None:
    body = {
        "model": SERVED,
        "prompt": "the draft model",
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        assert json.loads(response.read())["usage"]["completion_tokens"] == 16


def test_a_generated_command_serves_with_the_configured_k(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = require_vllm_python()
    env = offline_env(tmp_path)
    model = tmp_path / "tiny-llama"
    build_model(python, model, env)
    port = free_port()
    serving = tmp_path / "serving.yaml"
    serving.write_text(
        f"""\
vllm_version: "0.32.0"
target: {model}
served_model_name: {SERVED}
method: draft_model
draft: {model}
num_speculative_tokens: {K}
max_model_len: 1024
host: 127.0.0.1
port: {port}
device: cpu
extra_args: ["--dtype", "bfloat16"]
"""
    )
    out = tmp_path / "out"
    assert main(["serve-config", str(serving), "--python", python, "--out", str(out)]) == 0
    capsys.readouterr()
    script = out / "command.sh"
    assert "--speculative-config" in script.read_text()

    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "vllm.log"
    worker_cpus, other_cpus = omp_cpus()
    env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(worker_cpus)))
    own_cpus = os.sched_getaffinity(0)
    with log.open("wb") as handle:
        process = subprocess.Popen(
            ["/bin/sh", str(script)],  # the generated script: exec's the command, so vLLM leads the group
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    os.sched_setaffinity(0, other_cpus)
    try:
        started = time.monotonic()
        wait_healthy(process, url, log)
        print(f"vLLM from the generated command ready in {time.monotonic() - started:.1f}s")
        models = json.loads(_get(f"{url}/v1/models"))
        assert [entry["id"] for entry in models["data"]] == [SERVED], models
        assert models["data"][0]["root"] == str(model)
        before = spec_counters(_get(f"{url}/metrics"))
        assert sorted(before.per_position) == [str(i) for i in range(K)], tail(log)
        _complete(url)
        after = spec_counters(_get(f"{url}/metrics"))
        for _ in range(20):  # a step's statistics can land a moment after the response
            if after.drafts > before.drafts:
                break
            time.sleep(0.5)
            after = spec_counters(_get(f"{url}/metrics"))
        assert after.drafts > before.drafts
        assert sorted(after.per_position) == [str(i) for i in range(K)]
        assert after.draft_tokens - before.draft_tokens <= K * (after.drafts - before.drafts)
    finally:
        stop(process)
        os.sched_setaffinity(0, own_cpus)
