"""`specguard compat` against real vLLM 0.32.0 (CPU build): the pair it calls incompatible for their
vocabulary sizes is the pair vLLM refuses at start-up, with the sizes compat printed; a pair it
passes with a warning only (another chat template) gets through vLLM's config validation, where that
check lives (``EngineArgs.create_engine_config()``, which builds the SpeculativeConfig and so runs
``verify_equal_vocab_size_if_draft_model``, without loading weights or starting a server).

Two tiny Llamas from make_tiny_model.py: the target (vocabulary 512) and a draft trained the same way
with a vocabulary of 384. Starts a vLLM of its own (own_server), in its own process group, always
stopped."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from specguard.cli.entry import main
from tests.e2e.serving import STARTUP_TIMEOUT, build_model, offline_env, serve_command, stop, tail
from tests.ports import free_port
from tests.real import require_vllm_python

pytestmark = pytest.mark.own_server

DRAFT_VOCAB = 384
OTHER_TEMPLATE = "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n\n{% endfor %}"
ENGINE_CONFIG = """\
import json, sys
from vllm.engine.arg_utils import EngineArgs
target, draft = sys.argv[1:3]
args = EngineArgs(model=target, max_model_len=1024, dtype="bfloat16", speculative_config={
    "method": "draft_model", "model": draft, "num_speculative_tokens": 2})
try:
    args.create_engine_config()
except Exception as err:
    print(json.dumps({"accepted": False, "error": f"{type(err).__name__}: {err}"}))
else:
    print(json.dumps({"accepted": True}))
"""


def compat(target: Path, draft: Path) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["compat", str(target), str(draft), "--json"])
    return code, json.loads(out.getvalue())


def engine_config(python: str, target: Path, draft: Path, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run([python, "-c", ENGINE_CONFIG, str(target), str(draft)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, str], Path, Path, Path]:
    python = require_vllm_python()
    root = tmp_path_factory.mktemp("compat")
    env = offline_env(root)
    target, draft, restyled = root / "target", root / "draft", root / "restyled"
    build_model(python, target, env)
    build_model(python, draft, env, vocab_size=DRAFT_VOCAB)
    shutil.copytree(target, restyled)  # the target's very weights, another chat template
    (restyled / "chat_template.jinja").write_text(OTHER_TEMPLATE, encoding="utf-8")
    return python, root, env, target, draft, restyled


def test_vllm_refuses_the_pair_compat_calls_incompatible(
    pair: tuple[str, Path, dict[str, str], Path, Path, Path], report: Any
) -> None:
    python, root, env, target, draft, _ = pair
    code, found = compat(target, draft)
    assert code == 2
    sizes = next(c for c in found["checks"] if c["name"] == "vocab_size")
    assert sizes["verdict"] == "incompatible"
    t, d = sizes["data"]["target"], sizes["data"]["draft"]
    assert (t, d) == (512, DRAFT_VOCAB)
    sentence = f"Target model vocab_size={t}. Draft model vocab_size={d}."

    port = free_port()
    speculative = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    command = serve_command(python, target, port, speculative)
    log = root / "vllm.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=root, start_new_session=True)  # fmt: skip
    try:
        try:
            returncode = process.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"vLLM did not exit within {STARTUP_TIMEOUT:.0f}s:\n{tail(log)}", pytrace=False)
    finally:
        stop(process)
    report(f"vLLM refused the pair in {time.monotonic() - started:.1f}s (exit {returncode})")
    text = log.read_text(errors="replace")
    assert returncode != 0
    assert "Target and draft model should have the same vocabulary size." in text, tail(log)
    assert sentence in text, tail(log)
    assert found["checks"] and sentence in sizes["details"][0]


def test_vllm_validates_the_pairs_as_compat_judges_them(
    pair: tuple[str, Path, dict[str, str], Path, Path, Path], report: Any
) -> None:
    python, root, env, target, draft, restyled = pair
    code, found = compat(target, restyled)
    assert code == 1  # a warning, nothing incompatible
    assert [c["name"] for c in found["checks"] if c["verdict"] != "ok"] == ["rendering"]
    started = time.monotonic()
    assert engine_config(python, target, restyled, env, root) == {"accepted": True}
    refused = engine_config(python, target, draft, env, root)
    report(f"vLLM's config validation of both pairs took {time.monotonic() - started:.1f}s")
    assert refused["accepted"] is False
    assert f"Target model vocab_size=512. Draft model vocab_size={DRAFT_VOCAB}." in refused["error"]
