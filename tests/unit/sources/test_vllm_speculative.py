"""vLLM's speculative config rewritten where the host keeps it: the environment file systemd reads,
and vLLM's YAML config in both forms (a JSON string, read by every version; a mapping, passed on
as JSON only from 0.16), comments and other keys kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specguard.actions.vllm_restart import speculative
from tests.supervisor import parse_env, read_env

DRAFT = {
    "method": "draft_model",
    "model": "/models/my draft's",
    "num_speculative_tokens": 5,
    "draft_tensor_parallel_size": 1,
}

MAPPING = """\
# vLLM on gpu-node-7
model: /models/llama-8b   # the target
port: 8000
speculative-config:
  method: draft_model     # a small Llama
  model: /models/draft
  num_speculative_tokens: 5
  draft_tensor_parallel_size: 1
max-num-seqs: 128         # batch
"""

STRING = """\
# vLLM 0.15 on gpu-node-3
model: /models/llama-8b
speculative-config: '{"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 5}'
port: 8000  # the API
"""


def test_with_k_keeps_every_other_key_and_zero_is_off() -> None:
    assert speculative.with_k(DRAFT, 3) == {**DRAFT, "num_speculative_tokens": 3}
    assert speculative.with_k(DRAFT, 0) is None


def passed(env_text: str) -> list[str]:
    """The arguments vLLM gets from systemd/vllm.service's ExecStart: the file's variables in the
    environment (as systemd reads them), the JSON passed on through the shell."""
    env = parse_env(env_text)
    script = 'exec "$0" -c "import json, sys; print(json.dumps(sys.argv[1:]))" ' + (
        '${VLLM_SPECULATIVE_CONFIG:+"--speculative-config=$VLLM_SPECULATIVE_CONFIG"}'
    )
    done = subprocess.run(
        ["/bin/sh", "-c", script, sys.executable],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(done.stdout))


def test_the_env_file_gives_vllm_one_argument_with_the_json_or_none() -> None:
    text = speculative.render_env(speculative.with_k(DRAFT, 3), "k=3")
    (argument,) = passed(text)  # one argument, though the draft's path has a space and a quote
    assert argument.startswith("--speculative-config=")
    assert json.loads(argument.split("=", 1)[1]) == {**DRAFT, "num_speculative_tokens": 3}
    assert speculative.read_env(text, "s.env") == {**DRAFT, "num_speculative_tokens": 3}

    off = speculative.render_env(None, "off")
    assert passed(off) == []  # no argument at all
    assert speculative.read_env(off, "s.env") is None


def test_read_env_names_the_line_of_a_bad_value(tmp_path) -> None:
    path = tmp_path / "s.env"
    path.write_text("# x\nVLLM_SPECULATIVE_CONFIG='{not json'\n")
    assert read_env(path) == {"VLLM_SPECULATIVE_CONFIG": "{not json"}
    with pytest.raises(speculative.ConfigError, match=r"s.env:2: VLLM_SPECULATIVE_CONFIG is not JSON"):
        speculative.read_env(path.read_text(), "s.env")


def test_a_mapping_is_edited_in_place_comments_and_other_keys_kept() -> None:
    config = speculative.read_yaml(MAPPING, "vllm.yaml")
    assert config == {"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 5,
                      "draft_tensor_parallel_size": 1}  # fmt: skip
    out = speculative.render_yaml(MAPPING, speculative.with_k(config, 3), "0.32.0", "vllm.yaml")
    assert out == MAPPING.replace("num_speculative_tokens: 5", "num_speculative_tokens: 3")


def test_a_json_string_stays_a_json_string() -> None:
    config = speculative.read_yaml(STRING, "vllm.yaml")
    out = speculative.render_yaml(STRING, speculative.with_k(config, 1), "0.15.1", "vllm.yaml")
    assert "# vLLM 0.15 on gpu-node-3" in out and "port: 8000  # the API" in out
    assert speculative.read_yaml(out, "vllm.yaml") == {**config, "num_speculative_tokens": 1}
    line = next(x for x in out.splitlines() if x.startswith("speculative-config:"))
    assert isinstance(json.loads(line.split(":", 1)[1].strip().strip("'")), dict)  # still a string


def test_before_0_16_a_mapping_becomes_a_json_string() -> None:
    config = speculative.read_yaml(MAPPING, "vllm.yaml")
    out = speculative.render_yaml(MAPPING, speculative.with_k(config, 3), "0.15.1", "vllm.yaml")
    line = next(x for x in out.splitlines() if x.startswith("speculative-config:"))
    assert json.loads(line.split(":", 1)[1].strip().strip("'"))["num_speculative_tokens"] == 3
    assert "# vLLM on gpu-node-7" in out and "max-num-seqs: 128         # batch" in out


def test_off_removes_the_key_and_on_again_adds_it_in_the_form_the_version_reads() -> None:
    config = speculative.read_yaml(MAPPING, "vllm.yaml")
    off = speculative.render_yaml(MAPPING, None, "0.32.0", "vllm.yaml")
    assert "speculative-config" not in off and "# vLLM on gpu-node-7" in off and "port: 8000" in off
    assert speculative.read_yaml(off, "vllm.yaml") is None
    on_new = speculative.render_yaml(off, speculative.with_k(config, 1), "0.32.0", "vllm.yaml")
    assert "speculative-config:\n  method: draft_model" in on_new  # a mapping: 0.16 and later
    on_old = speculative.render_yaml(off, speculative.with_k(config, 1), "0.15.0", "vllm.yaml")
    assert speculative.read_yaml(on_old, "vllm.yaml") == {**config, "num_speculative_tokens": 1}
    assert "speculative-config: '{" in on_old  # a JSON string before 0.16
    unknown = speculative.render_yaml(off, speculative.with_k(config, 1), None, "vllm.yaml")
    assert "speculative-config: '{" in unknown  # every version reads a string


def test_bad_yaml_is_named_with_its_file_and_line() -> None:
    with pytest.raises(speculative.ConfigError, match=r"vllm\.yaml: not YAML"):
        speculative.read_yaml("model: [unclosed\n", "vllm.yaml")
    with pytest.raises(speculative.ConfigError, match=r"vllm\.yaml: not a mapping"):
        speculative.read_yaml("- a\n- b\n", "vllm.yaml")
    with pytest.raises(speculative.ConfigError, match=r"vllm.yaml:2: speculative-config is not JSON"):
        speculative.read_yaml("port: 1\nspeculative-config: '{oops'\n", "vllm.yaml")
    with pytest.raises(speculative.ConfigError, match=r"vllm.yaml:1: speculative_config is neither"):
        speculative.read_yaml("speculative_config: 5\n", "vllm.yaml")
