"""serve-config's serving file, its checks against a version and the three artifacts: what each
vLLM version is given, and that the action's own readers read back what this command writes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from specguard.actions.vllm_restart.speculative import read_env, read_yaml
from specguard.playbook.serve_config.checks import plan
from specguard.playbook.serve_config.render import (
    Launcher,
    RenderError,
    command_argv,
    command_text,
    extra_as_keys,
    vllm_env,
    vllm_yaml,
)
from specguard.playbook.serve_config.serving import ServingError, load_serving
from specguard.playbook.serve_config.versions import parse_version

SERVING = """\
# what vLLM serves
target: /models/target
served_model_name: llama
method: draft_model
draft: /models/draft
num_speculative_tokens: 4
port: 8000
"""


def serving_from(text: str, name: str = "serving.yaml"):  # type: ignore[no-untyped-def]
    return load_serving(Path(name), text)


def problems(text: str, version: str | None = None) -> list[str]:
    with pytest.raises(ServingError) as caught:
        loaded = serving_from(text)
        plan(loaded, parse_version(version or "0.32.0"))
    return [str(p) for p in caught.value.problems]


def test_the_documented_sample_loads() -> None:
    loaded = serving_from(SERVING)
    assert (loaded.target, loaded.method, loaded.draft, loaded.num_speculative_tokens) == (
        "/models/target", "draft_model", "/models/draft", 4,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SERVING.replace("num_speculative_tokens: 4", "num_speculative_tokens: 0"),
         "serving.yaml:6: num_speculative_tokens: Input should be greater than 0"),
        (SERVING.replace("num_speculative_tokens: 4", "num_speculative_tokens: -2"),
         "serving.yaml:6: num_speculative_tokens: Input should be greater than 0"),
        (SERVING.replace("method: draft_model", "method: eagel"),
         "serving.yaml:4: method: unknown speculative method 'eagel'; did you mean eagle"),
        (SERVING + "prot: 8001\n", "serving.yaml:8: prot: unknown key; did you mean port?"),
        (SERVING + 'vllm_version: 0.32\n', 'serving.yaml:8: vllm_version: write the version as a string in quotes'),
        (SERVING.replace("draft: /models/draft\n", ""), "serving.yaml:4: method: method draft_model needs `draft`"),
        (SERVING.replace("method: draft_model", "method: ngram"), "serving.yaml:5: draft: method ngram has no draft model"),
        (SERVING + "speculative_extra:\n  num_speculative_tokens: 3\n",
         "serving.yaml:9: speculative_extra.num_speculative_tokens: give it as the serving file's `num_speculative_tokens`"),
        (SERVING + "extra_args: ['--port', '9']\n", "serving.yaml:8: extra_args: Value error, --port: the serving"),
        (SERVING + "target: /other\n", "serving.yaml:8: invalid YAML: duplicate key 'target'"),
        (SERVING + "  bad: [\n", "serving.yaml:"),
        ("- a list\n", "serving.yaml:1: the serving file must be a mapping of keys"),
    ],
)  # fmt: skip
def test_a_bad_serving_file_is_named_with_its_line_and_key(text: str, expected: str) -> None:
    found = problems(text)
    assert any(line.startswith(expected.replace("Value error, ", "")) for line in found), found


def test_an_empty_file_says_what_it_needs() -> None:
    assert problems("") == [
        "serving.yaml: the file is empty: give at least target, method and num_speculative_tokens"
    ]


@pytest.mark.parametrize(
    ("extra", "version", "expected"),
    [
        ("method: medusa\ndraft: /h\n", "0.33.0", "serving.yaml:8: method: method 'medusa' was removed in vLLM 0.33.0"),
        ("method: draft_model\ndraft: /d\n", "0.14.1", "serving.yaml:8: method: method 'draft_model' needs vLLM 0.15.0"),
        ("method: custom_class\n", "0.34.0", "serving.yaml:8: method: method 'custom_class' was removed in vLLM 0.34.0"),
        ("method: ngram\nspeculative_extra:\n  disable_by_batch_size: 4\n", "0.17.0",
         "serving.yaml:10: speculative_extra.disable_by_batch_size: vLLM 0.17.0 refuses it at start-up"),
        ("method: ngram\nspeculative_extra:\n  prompt_lookup_mx: 4\n", "0.32.0",
         "serving.yaml:10: speculative_extra.prompt_lookup_mx: not a key of vLLM's speculative config; did you mean prompt_lookup_max"),
        ("method: ngram\nnum_speculative_tokens_per_batch_size: [[1, 8, 3]]\n", "0.22.0",
         "serving.yaml:9: num_speculative_tokens_per_batch_size: a k per batch size needs vLLM 0.25 or later"),
    ],
)  # fmt: skip
def test_what_the_version_does_not_have_is_an_error_at_its_line(
    extra: str, version: str, expected: str
) -> None:
    base = "target: /t\nnum_speculative_tokens: 3\nport: 1\nhost: h\nmax_model_len: 64\ntensor_parallel_size: 1\n\n"
    found = problems(base + extra, version)
    assert any(line.startswith(expected) for line in found), found


def test_a_key_an_old_version_ignores_is_left_out_with_a_warning() -> None:
    text = "target: /t\nmethod: ngram\nnum_speculative_tokens: 3\nspeculative_extra:\n  disable_by_batch_size: 4\n"
    p = plan(serving_from(text), parse_version("0.16.0"))
    assert "disable_by_batch_size" not in p.speculative
    assert p.warnings == [
        "speculative_extra.disable_by_batch_size: left out: vLLM 0.16.0 accepts it but does not use it (V1 engine, 0.10 on)"
    ]


@pytest.mark.parametrize(
    ("schedule", "says"),
    [("[[2, 8, 3]]", "must start at batch size 1"), ("[[1, 8, 3], [8, 9, 2]]", "overlap"),
     ("[[1, 0, 3]]", "start <= end"), ("[[1, 8, -1]]", "k must be 0 or more"), ("[]", "at least one")],
)  # fmt: skip
def test_the_k_per_batch_size_schedule_follows_vllms_rules(schedule: str, says: str) -> None:
    text = f"target: /t\nmethod: ngram\nnum_speculative_tokens: 3\nnum_speculative_tokens_per_batch_size: {schedule}\n"
    found = problems(text)
    assert any(
        line.startswith("serving.yaml:4: num_speculative_tokens_per_batch_size") and says in line
        for line in found
    ), found


# --- the artifacts ----------------------------------------------------------------------------------


def test_the_command_passes_the_speculative_config_as_json_with_the_long_flag() -> None:
    p = plan(serving_from(SERVING), parse_version("0.32.0"))
    argv = command_argv(p)
    assert argv[:3] == ["vllm", "serve", "/models/target"]
    assert argv[argv.index("--served-model-name") + 1] == "llama" and argv[argv.index("--port") + 1] == "8000"
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 4,
    }  # fmt: skip
    assert shlex.split(command_text(p)) == argv


def test_the_short_flag_exists_from_0_19() -> None:
    assert "-sc" in command_argv(plan(serving_from(SERVING), parse_version("0.19.0")), short=True)
    with pytest.raises(RenderError, match=r"-sc needs vLLM 0\.19\.0 or later, not 0\.18\.0"):
        command_argv(plan(serving_from(SERVING), parse_version("0.18.0")), short=True)


def test_the_module_form_names_the_model_with_model() -> None:
    argv = command_argv(
        plan(serving_from(SERVING), parse_version("0.32.0")), Launcher(python="/venv/bin/python")
    )
    assert argv[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/target",
    ]


@pytest.mark.parametrize(("version", "mapping"), [("0.15.1", False), ("0.16.0", True), ("0.32.0", True)])
def test_the_yaml_holds_a_mapping_from_0_16_and_a_json_string_before(version: str, mapping: bool) -> None:
    p = plan(serving_from(SERVING), parse_version(version))
    text = vllm_yaml(p, "serving.yaml")
    data = yaml.safe_load(text)
    value = data["speculative-config"]
    assert isinstance(value, dict) is mapping
    assert (value if mapping else json.loads(value)) == p.speculative
    assert read_yaml(text, "vllm.yaml") == p.speculative  # what the vllm_restart action reads back
    assert data["model"] == "/models/target" and data["served-model-name"] == "llama" and data["port"] == 8000


def test_the_env_file_is_what_the_vllm_restart_action_reads() -> None:
    p = plan(serving_from(SERVING), parse_version("0.32.0"))
    assert read_env(vllm_env(p, "serving.yaml"), "vllm.env") == p.speculative


def test_extra_args_become_yaml_keys_where_they_can() -> None:
    keys, left = extra_as_keys(("--enable-prefix-caching", "--max-num-seqs", "64", "--dtype=bfloat16", "-O3",
                                "--enable-prefix-caching", "--middleware", "a", "b"))  # fmt: skip
    assert keys == {
        "enable-prefix-caching": True,
        "max-num-seqs": "64",
        "dtype": "bfloat16",
        "middleware": ["a", "b"],
    }
    assert left == ["-O3", "--enable-prefix-caching"]


def test_the_extra_args_stay_on_the_command_line_as_written() -> None:
    text = SERVING + 'extra_args: ["--enable-prefix-caching", "--max-num-seqs", "64"]\n'
    argv = command_argv(plan(serving_from(text), parse_version("0.32.0")))
    assert argv[-3:] == ["--enable-prefix-caching", "--max-num-seqs", "64"]


def test_cpu_facts_are_warnings_when_the_file_says_cpu() -> None:
    text = SERVING + "device: cpu\n"
    assert any("AssertionError" in w for w in plan(serving_from(text), parse_version("0.19.0")).warnings)
    assert plan(serving_from(text), parse_version("0.32.0")).warnings == []
    assert plan(serving_from(SERVING), parse_version("0.19.0")).warnings == []
