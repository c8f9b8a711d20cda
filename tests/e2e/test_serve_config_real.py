"""What `specguard serve-config` generates for vLLM 0.32.0 is what vLLM 0.32.0 itself accepts: for
several serving files (draft_model, ngram with its prompt_lookup keys, a k per batch size, extra
args, -sc), the command line and the ``--config`` YAML go through vLLM's own argument parser (the
``vllm serve`` subcommand's and the api_server module's), ``EngineArgs.from_cli_args`` and the
speculative config's validation against the tiny local model (tests/e2e/vllm_parse_check.py). No
server is started.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specguard.playbook.serve_config.checks import plan
from specguard.playbook.serve_config.render import Launcher, command_argv, vllm_yaml
from specguard.playbook.serve_config.serving import load_serving
from specguard.playbook.serve_config.versions import parse_version
from tests.e2e.serving import build_model, offline_env
from tests.real import require_vllm_python

CHECK = Path(__file__).resolve().parent / "vllm_parse_check.py"
CHECK_TIMEOUT = 600.0
VERSION = parse_version("0.32.0")

# name -> the serving file, with MODEL standing for the tiny model's directory.
SERVINGS = {
    "draft_model": """\
vllm_version: "0.32.0"
target: MODEL
served_model_name: tiny
method: draft_model
draft: MODEL
num_speculative_tokens: 4
draft_tensor_parallel_size: 1
max_model_len: 512
host: 127.0.0.1
port: 8123
""",
    "ngram": """\
target: MODEL
method: ngram
num_speculative_tokens: 3
speculative_extra:
  prompt_lookup_max: 4
  prompt_lookup_min: 2
""",
    "per_batch_size": """\
target: MODEL
method: draft_model
draft: MODEL
num_speculative_tokens: 5
num_speculative_tokens_per_batch_size:
  - [1, 4, 5]
  - [5, 16, 3]
""",
    "extra_args": """\
target: MODEL
method: draft_model
draft: MODEL
num_speculative_tokens: 2
tensor_parallel_size: 1
extra_args: ["--enable-prefix-caching", "--max-num-seqs", "8", "--dtype=bfloat16"]
speculative_extra:
  max_model_len: 256
""",
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(the results vLLM gave for each case, the speculative config serve-config rendered for each file)."""
    python = require_vllm_python()
    root = tmp_path_factory.mktemp("serve-config")
    env = offline_env(root)
    model = root / "tiny-llama"
    build_model(python, model, env)
    cases: list[dict[str, Any]] = []
    expected: dict[str, Any] = {}
    for name, text in SERVINGS.items():
        path = root / f"{name}.yaml"
        path.write_text(text.replace("MODEL", str(model)))
        p = plan(load_serving(path), VERSION)
        expected[name] = p
        argv = command_argv(p)  # vllm serve MODEL ...
        cases.append({"name": f"{name}/serve", "form": "serve", "argv": argv[1:]})
        module = command_argv(p, Launcher(python=python))  # PYTHON -m vllm.entrypoints.openai.api_server ...
        cases.append({"name": f"{name}/api_server", "form": "api_server", "argv": module[3:]})
        cases.append({"name": f"{name}/short", "form": "serve", "argv": command_argv(p, short=True)[1:]})
        config = root / f"{name}.vllm.yaml"
        config.write_text(vllm_yaml(p, str(path)))
        cases.append({"name": f"{name}/yaml", "form": "serve", "argv": ["serve", "--config", str(config)]})
        cases.append(
            {"name": f"{name}/yaml_api_server", "form": "api_server", "argv": ["--config", str(config)]}
        )
    results = check(python, cases, root, env)
    yield results, {"model": str(model), **expected}


FORMS = ["serve", "api_server", "short", "yaml", "yaml_api_server"]


def check(python: str, cases: list[dict[str, Any]], root: Path, env: dict[str, str]) -> dict[str, Any]:
    """Each case through vLLM's own parser and validation (vllm_parse_check.py in vLLM's venv): its
    result by name; the check must answer for every case."""
    (root / "cases.json").write_text(json.dumps(cases))
    done = subprocess.run(
        [python, str(CHECK), str(root / "cases.json")],
        env=env, cwd=root, capture_output=True, text=True, timeout=CHECK_TIMEOUT, check=False,
    )  # fmt: skip
    results = {
        r["name"]: r
        for r in (
            json.loads(line[len("RESULT ") :])
            for line in done.stdout.splitlines()
            if line.startswith("RESULT ")
        )
    }
    assert len(results) == len(cases), f"the check ended early ({done.returncode}):\n{done.stderr[-3000:]}"
    return results


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", list(SERVINGS))
def test_vllm_accepts_what_serve_config_generates(
    checked: tuple[dict[str, Any], dict[str, Any]], name: str, form: str
) -> None:
    results, expected = checked
    result = results[f"{name}/{form}"]
    assert "error" not in result, result.get("error")
    spec = result["speculative"]
    wanted = expected[name].speculative
    assert spec["method"] == wanted["method"]
    assert spec["num_speculative_tokens"] == wanted["num_speculative_tokens"]
    assert result["model"] == expected["model"]
    if wanted["method"] == "draft_model":
        assert spec["model"] == expected["model"]
    if name == "draft_model":
        assert (result["served_model_name"], result["max_model_len"]) == ("tiny", 512)
        assert (result["host"], result["port"]) == ("127.0.0.1", 8123)
    if name == "ngram":
        assert (spec["prompt_lookup_max"], spec["prompt_lookup_min"]) == (4, 2)
    if name == "per_batch_size":
        assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 5], [5, 16, 3]]
    if name == "extra_args":
        assert (result["enable_prefix_caching"], result["max_num_seqs"]) == (True, 8)


def test_vllm_refuses_a_key_serve_config_refuses(tmp_path: Path) -> None:
    """The refusal serve-config makes from the table is vLLM 0.32.0's own: a removed key fails
    SpeculativeConfig's validation (extra="forbid"). Given straight to vLLM's parser and validation."""
    python = require_vllm_python()
    env = offline_env(tmp_path)
    model = tmp_path / "tiny-llama"
    build_model(python, model, env)
    config = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4})
    cases = [
        {"name": "refused", "form": "serve", "argv": ["serve", str(model), "--speculative-config", config]}
    ]
    result = check(python, cases, tmp_path, env)["refused"]
    assert "disable_by_batch_size" in result.get("error", ""), result
    serving = tmp_path / "s.yaml"
    serving.write_text(
        f"target: {model}\nmethod: ngram\nnum_speculative_tokens: 3\nspeculative_extra:\n  disable_by_batch_size: 4\n"
    )
    from specguard.playbook.serve_config.serving import ServingError

    with pytest.raises(ServingError, match="refuses it at start-up"):
        plan(load_serving(serving), VERSION)
