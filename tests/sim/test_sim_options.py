"""Reading the simulator's options the way vLLM reads its own: command line > --config file > defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specguard.common.yamlfile import FileProblems
from specguard.sim.cli import add_arguments, parse_args, parse_options
from specguard.sim.options import (
    OptionsError,
    SimOptions,
    SpeculativeConfig,
    load_speculative_config,
    options_from_args,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "sim" / "examples"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def config(tmp_path: Path, text: str, name: str = "vllm.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_speculative_config_json_keeps_the_keys_it_does_not_use() -> None:
    spec = load_speculative_config(
        parse("-sc", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    )
    assert spec == SpeculativeConfig("ngram", None, 3, {"prompt_lookup_max": 4})
    assert spec.to_dict() == {"num_speculative_tokens": 3, "method": "ngram", "prompt_lookup_max": 4}


def test_no_speculative_config_means_plain_decoding() -> None:
    options = options_from_args(parse())
    assert options.speculative is None and options.num_speculative_tokens == 0
    assert options == SimOptions()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"method": "ngram", "num_speculative_tokens": 0}', "must be an integer > 0"),
        ('{"method": "ngram"}', "`num_speculative_tokens` is required"),
        ('{"num_speculative_tokens": 2}', "give `method` or `model`"),
        ('{"method": "ngram", "num_speculative_tokens": 2', "invalid JSON"),
        ("[3]", "must be a JSON object"),
    ],
)
def test_bad_speculative_configs_are_refused_with_the_reason(value: str, message: str) -> None:
    with pytest.raises(OptionsError, match=message) as caught:
        load_speculative_config(parse("--speculative-config", value))
    assert str(caught.value).startswith("--speculative-config: ")


def test_the_config_file_is_read_like_vllms_and_the_command_line_wins(tmp_path: Path) -> None:
    path = config(
        tmp_path,
        "model: my-model\nport: 9000\nmax-num-seqs: 8\nacceptance: 0.5\n"
        "speculative-config:\n  method: eagle3\n  model: draft\n  num_speculative_tokens: 5\n",
    )
    from_file = options_from_args(parse("--config", path))
    assert (from_file.model, from_file.port, from_file.max_num_seqs) == ("my-model", 9000, 8)
    assert from_file.acceptance_by_position == [0.5]
    assert from_file.speculative == SpeculativeConfig("eagle3", "draft", 5)

    overridden = options_from_args(
        parse(
            "--config",
            path,
            "--port",
            "9100",
            "--acceptance-by-position",
            "0.9,0.4",
            "-sc",
            '{"method": "ngram", "num_speculative_tokens": 2}',
        )
    )
    assert overridden.port == 9100 and overridden.model == "my-model"
    assert overridden.acceptance_by_position == [0.9, 0.4]
    assert overridden.speculative == SpeculativeConfig("ngram", None, 2)


def test_a_speculative_config_given_as_a_json_string_in_the_file(tmp_path: Path) -> None:
    options = options_from_args(parse("--config", str(EXAMPLES / "vllm-config.yaml")))
    assert options.speculative == SpeculativeConfig("draft_model", "tiny-draft", 4)
    assert options.max_num_seqs == 64


def test_config_file_problems_name_the_file_and_line(tmp_path: Path) -> None:
    bad_spec = config(
        tmp_path, 'port: 9000\nspeculative-config: \'{"method": "ngram", "num_speculative_tokens": -1}\'\n'
    )
    with pytest.raises(OptionsError, match=rf"^{bad_spec}:2: speculative-config: .*must be an integer > 0"):
        options_from_args(parse("--config", bad_spec))
    bad_value = config(tmp_path, "port: eighty\n", "other.yaml")
    with pytest.raises(OptionsError, match=rf"^{bad_value}:1: port: "):
        options_from_args(parse("--config", bad_value))
    with pytest.raises(FileProblems, match=r"must end in \.yaml or \.yml"):
        options_from_args(parse("--config", config(tmp_path, "port: 1\n", "vllm.json")))


def test_option_values_are_checked() -> None:
    with pytest.raises(OptionsError, match="kv capacity"):
        SimOptions(kv_capacity_tokens=100, max_model_len=1024)
    with pytest.raises(OptionsError, match=r"in \[0, 1\]"):
        SimOptions(acceptance_by_position=[0.5, 1.2])
    with pytest.raises(SystemExit):
        parse("--acceptance", "0.5", "--acceptance-by-position", "0.5,0.4")  # mutually exclusive


def test_a_command_line_parses_straight_to_options() -> None:
    options = parse_options(
        ["--port", "0", "-sc", '{"model": "ngram", "num_speculative_tokens": 3}', "--seed", "4"]
    )
    assert options.speculative == SpeculativeConfig("ngram", "ngram", 3)  # method detected from the model
    assert (options.port, options.seed) == (0, 4)


def parse_like_vllm(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parse_args(parser, list(argv))


def test_the_dotted_form_builds_the_speculative_config_key_by_key() -> None:
    args = parse_like_vllm(
        "--speculative-config.method", "ngram",
        "--speculative-config.num_speculative_tokens", "3",
        "--speculative-config.prompt_lookup_max=4",
    )  # fmt: skip
    assert load_speculative_config(args) == SpeculativeConfig("ngram", None, 3, {"prompt_lookup_max": 4})
    short = parse_like_vllm("-sc.method", "ngram", "-sc.num-speculative-tokens", "1k")
    assert load_speculative_config(short) == SpeculativeConfig("ngram", None, 1000)  # 1k, as vLLM reads it


def test_the_dotted_form_replaces_a_json_config_rather_than_merging_with_it() -> None:
    # vLLM appends the assembled dotted object after every other argument; argparse keeps the last.
    args = parse_like_vllm(
        "--speculative-config.num_speculative_tokens", "2",
        "-sc", '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 5}',
        "--speculative-config.method", "ngram",
    )  # fmt: skip
    assert load_speculative_config(args) == SpeculativeConfig("ngram", None, 2)
    without_method = parse_like_vllm(
        "-sc",
        '{"method": "ngram", "num_speculative_tokens": 5}',
        "--speculative-config.num_speculative_tokens",
        "2",
    )
    with pytest.raises(OptionsError, match="give `method` or `model`"):
        load_speculative_config(without_method)  # the JSON's method is gone, as in vLLM


def test_a_dotted_key_given_twice_keeps_the_last_and_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    args = parse_like_vllm(
        "--speculative-config.method", "ngram",
        "--speculative-config.num_speculative_tokens", "2",
        "--speculative-config.num_speculative_tokens", "4",
    )  # fmt: skip
    assert load_speculative_config(args) == SpeculativeConfig("ngram", None, 4)
    assert "Found duplicate keys --speculative-config.num_speculative_tokens" in caplog.text


def test_underscores_in_option_names_mean_dashes_and_a_dotted_option_needs_a_value() -> None:
    assert parse_like_vllm("--max_num_seqs", "8", "--data_parallel_size=2").max_num_seqs == 8
    with pytest.raises(SystemExit):
        parse_like_vllm("--speculative-config.method")


def test_spec_shorthands_add_their_key_and_refuse_one_already_set(tmp_path: Path) -> None:
    assert load_speculative_config(parse_like_vllm("--spec-method", "ngram", "--spec-tokens", "3")) == (
        SpeculativeConfig("ngram", None, 3)
    )
    assert load_speculative_config(
        parse_like_vllm("-sc", '{"model": "draft", "method": "draft_model"}', "--spec-tokens", "2")
    ) == SpeculativeConfig("draft_model", "draft", 2)
    with pytest.raises(
        OptionsError,
        match=r"--spec-tokens and --speculative-config\['num_speculative_tokens'\] are mutually exclusive",
    ):
        load_speculative_config(
            parse_like_vllm("-sc", '{"method": "ngram", "num_speculative_tokens": 3}', "--spec-tokens", "2")
        )
    path = config(tmp_path, "speculative-config:\n  method: ngram\n  num_speculative_tokens: 3\n")
    with pytest.raises(OptionsError, match="--spec-method and"):
        load_speculative_config(parse_like_vllm("--config", path, "--spec-method", "eagle3"))


def test_data_parallel_prefix_caching_and_logprob_options_from_the_command_line_and_the_file(
    tmp_path: Path,
) -> None:
    options = parse_options(
        ["-dp", "2", "--block-size", "32", "--no-enable-prefix-caching", "--max-logprobs", "5"]
    )
    assert (options.data_parallel_size, options.block_size, options.enable_prefix_caching, options.max_logprobs) == (
        2, 32, False, 5,
    )  # fmt: skip
    path = config(tmp_path, "data-parallel-size: 3\nenable-prefix-caching: false\nblock-size: 64\n")
    from_file = options_from_args(parse_like_vllm("--config", path))
    assert (from_file.data_parallel_size, from_file.enable_prefix_caching, from_file.block_size) == (
        3,
        False,
        64,
    )
    bad = config(tmp_path, "enable-prefix-caching: maybe\n", "bad.yaml")
    with pytest.raises(OptionsError, match=rf"^{bad}:1: enable-prefix-caching: expected true or false"):
        options_from_args(parse_like_vllm("--config", bad))
    with pytest.raises(OptionsError, match="data-parallel-size must be >= 1"):
        SimOptions(data_parallel_size=0)
