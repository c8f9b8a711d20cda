"""diagnose case 4 against real vLLM 0.32.0 (CPU build): the tiny Llama target (vocabulary 512)
served with a draft of vocabulary 384 (``method: draft_model``) is refused at start-up; the case
reads that refusal from the server's own log, runs compat on the serving file's pair, and names the
cause with both sizes. Starts a vLLM of its own (own_server), which exits by itself, in its own
process group, always stopped."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Verdict
from specguard.playbook.diagnose.vocabulary import judge
from tests.e2e.serving import STARTUP_TIMEOUT, build_model, offline_env, serve_command, stop, tail
from tests.ports import free_port
from tests.real import require_vllm_python

pytestmark = pytest.mark.own_server

DRAFT_VOCAB = 384


async def test_the_refusal_in_vllms_log_and_compat_name_the_mismatch(tmp_path: Path, report: Any) -> None:
    python = require_vllm_python()
    env = offline_env(tmp_path)
    target, draft = tmp_path / "target", tmp_path / "draft"
    build_model(python, target, env)
    build_model(python, draft, env, vocab_size=DRAFT_VOCAB)
    serving = tmp_path / "serving.yaml"
    serving.write_text("target: ./target\nmethod: draft_model\ndraft: ./draft\nnum_speculative_tokens: 2\n")

    speculative = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    log = tmp_path / "vllm.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(serve_command(python, target, free_port(), speculative), stdout=sink,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path,
                                   start_new_session=True)  # fmt: skip
    try:
        try:
            returncode = process.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"vLLM did not exit within {STARTUP_TIMEOUT:.0f}s:\n{tail(log)}", pytrace=False)
    finally:
        stop(process)
    report(f"vLLM refused the pair in {time.monotonic() - started:.1f}s (exit {returncode})")
    assert returncode != 0, tail(log)

    found = await judge(Evidence("history", 0.0, 60.0, serving_file=serving, log_file=log))
    assert found.verdict is Verdict.CAUSE_FOUND, found
    assert (
        f"vLLM refused to start: target vocab_size 512, draft {DRAFT_VOCAB} (log file {log}" in found.summary
    )
    assert "compat calls the pair incompatible" in found.summary
    sizes = {(f.name, f.scope): f.value for f in found.figures}
    assert sizes[("target_vocab_size", "refusal")] == sizes[("target_vocab_size", "config.json")] == 512
    assert sizes[("draft_vocab_size", "refusal")] == sizes[("draft_vocab_size", "config.json")] == DRAFT_VOCAB
    assert found.missing == ()
