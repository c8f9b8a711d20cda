"""What the simulator is told: vLLM's own serving options plus the knobs of the decoding model.

The speculative config is read exactly the way a vLLM service reads it (``--speculative-config``
JSON, or the ``speculative-config`` key of a ``--config`` YAML file, the command line winning), in
one function, :func:`load_speculative_config`, because a later action rewrites that config to
restart vLLM with fewer speculative tokens and the simulator must read the result the same way.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.common.yamlfile import FileProblems, LineDict, Problem, load_yaml
from specguard.sim.model import beta_parameters
from specguard.sim.scenario import Scenario, load_scenario

# Conditional acceptance of a trained EAGLE-style head at temperature 0: EAGLE-1 Table 2 measures
# 0-alpha of 0.74-0.79 at position 0 (speculative-math.md section 3); 0.8 is that, rounded.
DEFAULT_ACCEPTANCE = 0.8
# Acceptance at temperature T is a * exp(-decay * T). EAGLE-1 and EAGLE-3 report acceptance lengths
# at T = 0 and T = 1 (tau 3.61-4.52 -> 3.29-3.79; 6.23 -> 4.92 for LLaMA 3.1 8B); solving Eq. 1 for
# alpha gives alpha(1) / alpha(0) of about 0.92, i.e. decay ~= 0.08, rounded to 0.1. The random
# tiny-llama self-draft measured on CPU (vllm-on-cpu.md) drops much faster (1.0 -> ~0.1 conditional
# at T = 1.5, decay ~= 1.5): pass --temperature-decay 1.5 to stage that.
DEFAULT_TEMPERATURE_DECAY = 0.1
# Decode is memory-bound: one more sequence in the batch reads its KV cache and little else. An 8B
# model on one H100 goes from ~7 ms per step at batch 1 to ~12 ms at batch 64, ~1% per request.
DEFAULT_BATCH_SLOWDOWN = 0.01
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default
DEFAULT_MAX_MODEL_LEN = 1024  # what the captured tiny-llama served (tests/fixtures)
DEFAULT_KV_CAPACITY_TOKENS = 262_144  # kv_cache_size_tokens of the captured server
# Prefill is compute-bound and processes a prompt in parallel: one target step's time prefills
# about this many prompt tokens (a 512-token prompt doubles its first step).
DEFAULT_PREFILL_TOKENS_PER_STEP = 512
# Without max_tokens and ignore_eos a request ends at its own EOS, after a geometrically distributed
# number of tokens with this mean (vLLM's default max_tokens is the rest of the context window).
DEFAULT_MEAN_OUTPUT_TOKENS = 128
# vLLM's block size on GPUs (the CPU backend uses 128): the prefix cache hits whole blocks only.
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs

CONFIG_SUFFIXES = (".yaml", ".yml")  # vLLM's FlexibleArgumentParser accepts only these


class OptionsError(ValueError):
    """An option cannot be used; the message names it and says why."""


@dataclass
class SpeculativeConfig:
    """vLLM's ``--speculative-config``: the keys the simulator uses, the others kept in ``extra``."""

    method: str | None
    model: str | None
    num_speculative_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SpeculativeConfig:
        if not isinstance(data, Mapping):
            raise OptionsError(f"the speculative config must be a JSON object, got {type(data).__name__}")
        known = {"method", "model", "num_speculative_tokens"}
        method, model, k = data.get("method"), data.get("model"), data.get("num_speculative_tokens")
        for key, value in (("method", method), ("model", model)):
            if value is not None and not isinstance(value, str):
                raise OptionsError(f"speculative config: `{key}` must be a string, got {value!r}")
        if k is None:
            raise OptionsError("speculative config: `num_speculative_tokens` is required")
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            # vLLM: Field(gt=0). Turning speculation off means removing the whole config.
            raise OptionsError(
                f"speculative config: `num_speculative_tokens` must be an integer > 0, got {k!r} "
                "(to disable speculative decoding, remove the speculative config)"
            )
        if method is None and model is None:
            raise OptionsError("speculative config: give `method` or `model` (vLLM needs one of them)")
        if method is None and model in {"ngram", "[ngram]"}:
            method = "ngram"  # vLLM detects the method from the model name
        return cls(method, model, k, {key: v for key, v in data.items() if key not in known})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_speculative_tokens": self.num_speculative_tokens}
        if self.method is not None:
            out["method"] = self.method
        if self.model is not None:
            out["model"] = self.model
        return {**out, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


@dataclass
class SimOptions:
    model: str = "tiny-llama"
    host: str = "127.0.0.1"
    port: int = 8000
    speculative: SpeculativeConfig | None = None  # None: plain decoding, no spec_decode metrics
    # Conditional acceptance per draft position at temperature 0: position i is accepted with this
    # probability given 0..i-1 were. Shorter than k: the last value repeats; longer: the rest unused.
    acceptance_by_position: list[float] = field(default_factory=lambda: [DEFAULT_ACCEPTANCE])
    temperature_decay: float = DEFAULT_TEMPERATURE_DECAY  # acceptance(T) = a * exp(-decay * T)
    # Standard deviation of a request's own acceptance around the configured level (position 0's),
    # a Beta per request; its other positions scale with it. 0: every request alike.
    acceptance_spread: float = 0.0
    step_time: float = 0.02  # seconds per target-model step at batch 1
    draft_cost: float = 0.05  # c: draft step / target step (Leviathan: "always less than 0.05")
    batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN  # step time grows this much per extra request
    # A target step's share each token it verifies costs in compute (running * (k + 1) tokens a
    # step); once they outweigh the memory-bound step, decode is compute-bound (sim.model). 0: never.
    verify_token_cost: float = 0.0
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    kv_capacity_tokens: int = DEFAULT_KV_CAPACITY_TOKENS
    startup_delay: float = 0.0
    scenario: Scenario | None = None
    seed: int | None = None
    ground_truth_file: Path | None = None
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    prefill_tokens_per_step: int = DEFAULT_PREFILL_TOKENS_PER_STEP
    mean_output_tokens: float = DEFAULT_MEAN_OUTPUT_TOKENS
    # Engines behind the one API server, each with its own scheduler, KV cache (kv_capacity_tokens
    # each) and `engine` label, as vLLM's --data-parallel-size gives them.
    data_parallel_size: int = 1
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    max_logprobs: int = DEFAULT_MAX_LOGPROBS

    def __post_init__(self) -> None:
        self.acceptance_by_position = check_acceptance(self.acceptance_by_position)
        _check(0 <= self.port <= 65535, "port must be 0-65535 (0: the OS picks)")
        _check(
            _finite(self.temperature_decay) and self.temperature_decay >= 0, "temperature decay must be >= 0"
        )
        _check(
            _finite(self.acceptance_spread) and self.acceptance_spread >= 0, "acceptance spread must be >= 0"
        )
        if self.acceptance_spread > 0:
            try:
                beta_parameters(self.acceptance_by_position[0], self.acceptance_spread)
            except ValueError as exc:
                raise OptionsError(f"acceptance spread: {exc}") from None
        _check(_finite(self.step_time) and self.step_time > 0, "step time must be > 0 seconds")
        _check(_finite(self.draft_cost) and self.draft_cost >= 0, "draft cost must be >= 0")
        _check(_finite(self.batch_slowdown) and self.batch_slowdown >= 0, "batch slowdown must be >= 0")
        _check(
            _finite(self.verify_token_cost) and self.verify_token_cost >= 0, "verify token cost must be >= 0"
        )
        _check(self.max_num_seqs >= 1, "max-num-seqs must be >= 1")
        _check(self.max_model_len >= 2, "max-model-len must be >= 2")
        _check(self.prefill_tokens_per_step >= 1, "prefill tokens per step must be >= 1")
        _check(
            _finite(self.mean_output_tokens) and self.mean_output_tokens >= 1,
            "mean output tokens must be >= 1",
        )
        _check(_finite(self.startup_delay) and self.startup_delay >= 0, "startup delay must be >= 0 seconds")
        _check(self.data_parallel_size >= 1, "data-parallel-size must be >= 1")
        _check(self.block_size >= 1, "block-size must be >= 1")
        _check(self.max_logprobs >= 0, "max-logprobs must be >= 0")
        if self.scenario is not None:
            for event in self.scenario.timeline:
                _check(
                    event.engine is None or event.engine < self.data_parallel_size,
                    f"scenario event at {event.at:g}s names engine {event.engine}, but there are "
                    f"{self.data_parallel_size} engine(s) (0-{self.data_parallel_size - 1})",
                )
        # vLLM refuses to start when the KV cache cannot hold one request of max_model_len tokens
        # (plus the draft slots it reserves), and so does the simulator: a request that alone does
        # not fit could never finish.
        needed = self.max_model_len + self.num_speculative_tokens
        _check(
            self.kv_capacity_tokens >= needed,
            f"kv capacity ({self.kv_capacity_tokens} tokens) cannot hold one request of max-model-len "
            f"{self.max_model_len} plus {self.num_speculative_tokens} draft tokens; give at least {needed}",
        )

    @property
    def num_speculative_tokens(self) -> int:
        """k; 0 without speculative decoding."""
        return self.speculative.num_speculative_tokens if self.speculative else 0


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise OptionsError(message)


def check_acceptance(values: float | Sequence[float]) -> list[float]:
    """Acceptance probabilities as a non-empty list of numbers in [0, 1]."""
    items = [values] if isinstance(values, int | float) else list(values)
    if not items:
        raise OptionsError("acceptance needs at least one value")
    out = []
    for value in items:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise OptionsError(f"acceptance values must be numbers in [0, 1], got {value!r}")
        out.append(float(value))
    return out


# --- reading the command line and vLLM's --config file ---------------------------------------------


@dataclass(frozen=True)
class ConfigFile:
    """A vLLM-style ``--config`` YAML file: ``{dest: value}`` (``max-num-seqs`` -> ``max_num_seqs``)."""

    path: Path
    values: dict[str, Any]
    lines: dict[str, int]

    def where(self, dest: str) -> str:
        """``file:line: key`` of ``dest``, for messages."""
        line = self.lines.get(dest)
        key = dest.replace("_", "-")
        return f"{self.path}:{line}: {key}" if line else f"{self.path}: {key}"


def read_config_file(path: Path) -> ConfigFile:
    """Parse a vLLM ``--config`` file. Raises FileProblems (``file:line: message``)."""
    label = str(path)
    if path.suffix not in CONFIG_SUFFIXES:
        raise FileProblems([Problem(label, None, "", "a vLLM config file must end in .yaml or .yml")])
    data = load_yaml(path)
    if data is None:
        return ConfigFile(path, {}, {})
    if not isinstance(data, dict):
        raise FileProblems(
            [Problem(label, getattr(data, "line", None), "", "expected a mapping of option: value")]
        )
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for key, value in data.items():
        # vLLM turns each key into `--key value`: `max-num-seqs` and `max_num_seqs` both work.
        dest = str(key).lstrip("-").replace("-", "_")
        values[dest] = value
        if isinstance(data, LineDict) and key in data.key_lines:
            lines[dest] = data.key_lines[key]
    return ConfigFile(path, values, lines)


def _config_file(args: argparse.Namespace) -> ConfigFile | None:
    path = getattr(args, "config", None)
    return None if path is None else read_config_file(Path(path))


_SHORTHANDS = (
    ("--spec-method", "spec_method", "method"),
    ("--spec-model", "spec_model", "model"),
    ("--spec-tokens", "spec_tokens", "num_speculative_tokens"),
)


def load_speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """The speculative config a vLLM started with ``args`` would use; None when there is none.

    ``--speculative-config``/``-sc`` (a JSON string, or what its dotted form assembled) wins over
    the ``speculative-config`` key of the ``--config`` YAML file, which may hold a JSON string or
    (vLLM >= 0.16) a mapping. ``--spec-method``/``--spec-model``/``--spec-tokens`` then add their
    key; one the config already has is an error, as in vLLM. Raises OptionsError or FileProblems.
    """
    raw: Any = getattr(args, "speculative_config", None)
    where = "--speculative-config"
    config = _config_file(args)
    if raw is None and config is not None and config.values.get("speculative_config") is not None:
        raw = config.values["speculative_config"]
        where = config.where("speculative_config")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise OptionsError(f"{where}: invalid JSON: {exc}") from None
    if raw is not None and not isinstance(raw, Mapping):
        raise OptionsError(f"{where}: the speculative config must be a JSON object, got {type(raw).__name__}")
    merged: dict[str, Any] | None = None if raw is None else dict(raw)
    for flag, dest, key in _SHORTHANDS:
        value = getattr(args, dest, None)
        if value is None and config is not None:
            value = config.values.get(dest)  # a config file's keys become command-line options
        if value is None:
            continue
        merged = {} if merged is None else merged
        if key in merged:
            raise OptionsError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        merged[key] = value
        where = flag if raw is None else where
    if merged is None:
        return None
    try:
        # vLLM accepts `num-speculative-tokens` for `num_speculative_tokens` at the top level.
        return SpeculativeConfig.from_mapping({str(k).replace("-", "_"): v for k, v in merged.items()})
    except OptionsError as exc:
        raise OptionsError(f"{where}: {exc}") from None


def parse_acceptance_list(text: str) -> list[float]:
    """``"0.9,0.8,0.7"`` -> ``[0.9, 0.8, 0.7]`` (argparse type)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
        return check_acceptance(values)
    except (ValueError, OptionsError):
        raise argparse.ArgumentTypeError(
            f"expected numbers in [0, 1] separated by commas, got {text!r}"
        ) from None


def parse_probability(text: str) -> float:
    """A number in [0, 1] (argparse type)."""
    try:
        return check_acceptance([float(text)])[0]
    except (ValueError, OptionsError):
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None


# Options a config file may set besides speculative-config and acceptance, with their converters
# (the command line converts its own values through argparse).
_CONVERTERS: dict[str, Any] = {
    "model": str,
    "host": str,
    "port": int,
    "max_num_seqs": int,
    "max_model_len": int,
    "temperature_decay": float,
    "acceptance_spread": float,
    "step_time": float,
    "draft_cost": float,
    "batch_slowdown": float,
    "verify_token_cost": float,
    "kv_capacity_tokens": int,
    "prefill_tokens_per_step": int,
    "mean_output_tokens": float,
    "startup_delay": float,
    "scenario": Path,
    "seed": int,
    "ground_truth": Path,
    "data_parallel_size": int,
    "block_size": int,
    "enable_prefix_caching": bool,
    "max_logprobs": int,
}
_ACCEPTANCE_KEYS = ("acceptance", "acceptance_by_position")


def _file_value(config: ConfigFile, dest: str) -> Any:
    value = config.values[dest]
    try:
        if dest == "acceptance_by_position":
            return parse_acceptance_list(value) if isinstance(value, str) else check_acceptance(value)
        if dest == "acceptance":
            return check_acceptance([value])
        if dest == "enable_prefix_caching":
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {value!r}")
            return value
        if isinstance(value, bool | list | dict) or value is None:
            raise ValueError(f"unexpected value {value!r}")
        return _CONVERTERS[dest](value)
    except (ValueError, TypeError, OptionsError, argparse.ArgumentTypeError) as exc:
        raise OptionsError(f"{config.where(dest)}: {exc}") from None


def ignored_config_keys(args: argparse.Namespace) -> list[str]:
    """Keys of the ``--config`` file the simulator does not model (dtype, tensor parallelism...)."""
    config = _config_file(args)
    if config is None:
        return []
    known = {*_CONVERTERS, *_ACCEPTANCE_KEYS, "speculative_config", *(dest for _, dest, _ in _SHORTHANDS)}
    return sorted(key.replace("_", "-") for key in config.values if key not in known)


def _acceptance(args: argparse.Namespace, config: ConfigFile | None) -> list[float] | None:
    # The two options say the same thing, so the command line's replaces either of the file's.
    if getattr(args, "acceptance", None) is not None:
        return [args.acceptance]
    if getattr(args, "acceptance_by_position", None) is not None:
        return list(args.acceptance_by_position)
    if config is None:
        return None
    present = [key for key in _ACCEPTANCE_KEYS if key in config.values]
    if len(present) == 2:
        raise OptionsError(f"{config.path}: give `acceptance` or `acceptance-by-position`, not both")
    return _file_value(config, present[0]) if present else None


def options_from_args(args: argparse.Namespace) -> SimOptions:
    """SimOptions from parsed ``args``: command line > ``--config`` file > defaults (as in vLLM).

    Raises OptionsError or FileProblems (the scenario file's or the config file's).
    """
    config = _config_file(args)
    values: dict[str, Any] = {}
    for dest in _CONVERTERS:
        given = getattr(args, dest, None)
        if given is not None:
            values[dest] = given
        elif config is not None and dest in config.values:
            values[dest] = _file_value(config, dest)
    scenario_path = values.pop("scenario", None)
    values["ground_truth_file"] = values.pop("ground_truth", None)
    acceptance = _acceptance(args, config)
    if acceptance is not None:
        values["acceptance_by_position"] = acceptance
    return SimOptions(
        **values,
        speculative=load_speculative_config(args),
        scenario=load_scenario(Path(scenario_path)) if scenario_path is not None else None,
    )
