"""What each vLLM release accepts of a speculative config, as data.

The facts come from the vLLM reference kept with the project (its section 4, "--speculative-config
CLI", and section 6, "Speculative decoding on the CPU backend"), checked against the released
wheels; the schedule rules of ``num_speculative_tokens_per_batch_size`` from vLLM 0.32.0's
``vllm/v1/spec_decode/dynamic/utils.py``:

- ``--speculative-config JSON`` from 0.8.2 (the separate ``--speculative-model``... flags are gone
  from 0.8.3); the alias ``-sc`` from 0.19.0; in ``vllm serve --config FILE`` a nested mapping is
  passed on as JSON only from 0.16 (before, the JSON must be written as a string).
- The ``method`` table (``METHODS``): which release brought each method, and which took it away.
  ``draft_model`` is listed from 0.10 but raises ``NotImplementedError`` on the V1 engine until
  0.15.0, so it counts from 0.15.
- The keys (``KEYS``): the releases that know each one. Up to 0.15 the config ignores keys it does
  not know (a pydantic dataclass with the default ``extra``); from 0.16 (``extra="forbid"``) it
  refuses them at start-up. ``disable_by_batch_size`` is still a field up to 0.16 but unused by the
  V1 engine (0.10 on), and refused from 0.17.
- The reference covers the V1 engine, 0.10 to 0.34: older releases are refused (their methods are
  not in the table), newer ones are treated as 0.34 with a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Version = tuple[int, int, int]
UNBOUNDED: Version = (999, 0, 0)

SPECULATIVE_CONFIG_SINCE: Version = (0, 8, 2)  # --speculative-config JSON
SEPARATE_FLAGS_GONE: Version = (0, 8, 3)  # --speculative-model and its siblings removed
V1_SINCE: Version = (0, 10, 0)  # the first release of the reference's table (V0's spec decode removed)
SHORT_FLAG_SINCE: Version = (0, 19, 0)  # -sc
MAPPING_SINCE: Version = (0, 16, 0)  # a YAML mapping under speculative-config is passed on as JSON
FORBID_SINCE: Version = (0, 16, 0)  # unknown keys refused at start-up (before: ignored)
K_GT_ZERO_SINCE: Version = (0, 12, 0)  # num_speculative_tokens: Field(gt=0)
LAST_KNOWN: Version = (0, 34, 0)  # the newest release the reference describes


class VersionError(ValueError):
    """A vLLM version that cannot be read, or that the reference does not cover."""


def parse_version(text: str) -> Version:
    """``"0.32.0"``, ``"0.10"``, ``"0.8.5.post1"``, ``"0.32.0+cpu"`` -> (0, 32, 0)."""
    match = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?([.+-]?[0-9A-Za-z.+-]*)?\s*", str(text))
    if match is None:
        raise VersionError(f"{text!r} is not a vLLM version (e.g. 0.32.0)")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def show(version: Version) -> str:
    return ".".join(map(str, version))


def covered(version: Version) -> Version:
    """The release whose facts apply: ``version`` itself, or the newest known for a newer one.
    Raises VersionError for a release before the table."""
    if version < V1_SINCE:
        raise VersionError(
            f"vLLM {show(version)} is older than 0.10.0, the first release specguard knows the speculative "
            "methods of (the V1 engine; V0's speculative decoding was removed in 0.10.0)"
            + (
                ""
                if version >= SPECULATIVE_CONFIG_SINCE
                else "; it has no --speculative-config either (0.8.2+)"
            )
        )
    return min(version, LAST_KNOWN)


def newer_than_known(version: Version) -> str | None:
    if version[:2] > LAST_KNOWN[:2]:
        return (
            f"vLLM {show(version)} is newer than {show(LAST_KNOWN)}, the newest release specguard knows: "
            f"rendered as for {show(LAST_KNOWN)}"
        )
    return None


@dataclass(frozen=True)
class Span:
    """Known from ``since`` (inclusive) until ``until`` (exclusive: the release that removed it)."""

    since: Version
    until: Version = UNBOUNDED
    note: str = ""

    def has(self, version: Version) -> bool:
        return self.since <= version < self.until

    def describe(self) -> str:
        if self.until == UNBOUNDED:
            return f"it exists from vLLM {show(self.since)}"
        if self.since == (0, 0, 0):
            return f"it was removed in vLLM {show(self.until)}"
        return f"it exists from vLLM {show(self.since)} and was removed in {show(self.until)}"


# `method` of the speculative config: the releases that have each one.
METHODS: dict[str, Span] = {
    "ngram": Span((0, 10, 0)),
    "eagle": Span((0, 10, 0)),
    "eagle3": Span((0, 10, 0)),
    "medusa": Span((0, 10, 0), (0, 33, 0)),
    "mlp_speculator": Span((0, 10, 0), (0, 33, 0)),
    "draft_model": Span(
        (0, 15, 0),
        note="vLLM 0.10 to 0.14 name it but raise NotImplementedError: draft-model speculative decoding "
        "works on the V1 engine from 0.15.0",
    ),
    "deepseek_mtp": Span((0, 10, 0)),
    "ernie_mtp": Span((0, 10, 2)),
    "qwen3_next_mtp": Span((0, 10, 2)),
    "mimo_mtp": Span((0, 11, 0)),
    "longcat_flash_mtp": Span((0, 11, 0)),
    "mtp": Span((0, 11, 0)),
    "suffix": Span((0, 12, 0), note="needs the arctic-inference package beside vLLM"),
    "glm4_moe_mtp": Span((0, 12, 0)),
    "pangu_ultra_moe_mtp": Span((0, 12, 0)),
    "extract_hidden_states": Span((0, 17, 0)),
    "ngram_gpu": Span((0, 18, 0)),
    "dflash": Span((0, 20, 0)),
    "custom_class": Span((0, 22, 0), (0, 34, 0), note="from 0.34, plugins register custom methods"),
    "dspark": Span((0, 25, 0)),
}
# Methods whose drafter is a model of its own (`draft` in the serving file), and those that have
# none (n-gram and suffix matching; the MTP kinds use the target's own layers).
NEEDS_DRAFT = frozenset({"draft_model", "eagle", "eagle3", "medusa", "mlp_speculator"})
NO_DRAFT = frozenset(
    {"ngram", "ngram_gpu", "suffix"} | {name for name in METHODS if name == "mtp" or name.endswith("_mtp")}
)

# Keys of the speculative config (besides method, model and num_speculative_tokens, known to all).
_ALL = Span((0, 10, 0))
KEYS: dict[str, Span] = {
    "method": _ALL,
    "model": _ALL,
    "num_speculative_tokens": _ALL,
    "prompt_lookup_max": _ALL,
    "prompt_lookup_min": _ALL,
    "draft_tensor_parallel_size": _ALL,
    "tensor_parallel_size": Span(
        (0, 10, 0), note="accepted only to warn: the draft's tensor parallelism is draft_tensor_parallel_size"
    ),
    "quantization": _ALL,
    "max_model_len": _ALL,
    "revision": _ALL,
    "code_revision": _ALL,
    "enforce_eager": Span((0, 11, 0)),
    "disable_padded_drafter_batch": Span((0, 11, 0), (0, 34, 0)),
    "speculative_token_tree": Span((0, 10, 0), (0, 21, 0)),
    "parallel_drafting": Span((0, 16, 0)),
    "suffix_decoding_max_tree_depth": Span((0, 12, 0)),
    "suffix_decoding_max_cached_requests": Span((0, 12, 0)),
    "suffix_decoding_max_spec_factor": Span((0, 12, 0)),
    "suffix_decoding_min_token_prob": Span((0, 12, 0)),
    "rejection_sample_method": Span((0, 18, 0)),
    "draft_sample_method": Span((0, 21, 0)),
    "attention_backend": Span((0, 21, 0)),
    "moe_backend": Span((0, 19, 0)),
    "kv_cache_dtype": Span((0, 30, 0)),
    "num_speculative_tokens_per_batch_size": Span((0, 25, 0)),
    "use_heterogeneous_vocab": Span((0, 25, 0), (0, 34, 0)),
    # Removed keys: a V0 engine's (gone with it in 0.10.0), then these two.
    "acceptance_method": Span((0, 0, 0), (0, 10, 0)),
    "posterior_threshold": Span((0, 0, 0), (0, 10, 0)),
    "posterior_alpha": Span((0, 0, 0), (0, 10, 0)),
    "disable_mqa_scorer": Span((0, 0, 0), (0, 10, 0)),
    "disable_logprobs": Span((0, 0, 0), (0, 12, 0)),
    "disable_by_batch_size": Span((0, 0, 0), (0, 17, 0), note="unused by the V1 engine (vLLM 0.10 on)"),
}
UNUSED_FROM_V1 = frozenset({"disable_by_batch_size"})  # a field still, but the V1 engine ignores it


@dataclass(frozen=True)
class KeyVerdict:
    """What ``version`` does with a key of the speculative config: ``ok``, ``dropped`` (accepted
    or ignored but without effect: left out, with a warning), or ``refused`` (vLLM would not start)."""

    status: Literal["ok", "dropped", "refused", "unknown"]
    reason: str = ""


def key_verdict(key: str, version: Version) -> KeyVerdict:
    span = KEYS.get(key)
    if span is None:
        return KeyVerdict("unknown", "not a key of vLLM's speculative config")
    v = show(version)
    if span.has(version):
        if key in UNUSED_FROM_V1 and version >= V1_SINCE:
            return KeyVerdict("dropped", f"vLLM {v} accepts it but does not use it (V1 engine, 0.10 on)")
        if span.note:
            return KeyVerdict("ok", span.note)
        return KeyVerdict("ok")
    known = span.describe()
    if version >= FORBID_SINCE:
        return KeyVerdict(
            "refused", f"vLLM {v} refuses it at start-up (unknown keys are an error from 0.16); {known}"
        )
    return KeyVerdict("dropped", f"vLLM {v} ignores it (unknown keys are ignored up to 0.15); {known}")


def method_problem(method: str, version: Version) -> str | None:
    """Why ``method`` cannot be used on ``version`` (None: it can)."""
    span = METHODS.get(method)
    if span is None:
        return f"{method!r} is not a speculative method of vLLM (known: {', '.join(sorted(METHODS))})"
    if span.has(version):
        return None
    v = show(version)
    if version < span.since:
        note = f"; {span.note}" if span.note else ""
        return f"method {method!r} needs vLLM {show(span.since)} or later, not {v}{note}"
    note = f"; {span.note}" if span.note else ""
    return f"method {method!r} was removed in vLLM {show(span.until)}: {v} does not have it{note}"


def method_note(method: str, version: Version) -> str | None:
    """A warning worth giving about a method that does exist in ``version``."""
    span = METHODS.get(method)
    if span is not None and span.has(version) and method == "suffix":
        return f"method 'suffix' {span.note}"
    return None


def cpu_warnings(method: str, version: Version) -> list[str]:
    """What the reference says of speculative decoding on vLLM's CPU backend (its section 6)."""
    v = show(version)
    if version < (0, 20, 0):
        return [
            f"vLLM {v}'s CPU backend does not support speculative decoding: it stops at start-up with "
            "'AssertionError: spec decode is not supported.' (0.10 to 0.19)"
        ]
    if version < (0, 21, 0):
        return [
            f"vLLM {v}'s CPU rejection sampler is broken (TypeError: unexpected keyword argument "
            "'SYNTHETIC_MODE'); fixed in 0.21.0"
        ]
    if version < (0, 34, 0):
        if method in ("ngram", "draft_model"):
            return []
        return [
            f"on vLLM {v}'s CPU backend only ngram and draft_model are known to run speculative decoding "
            f"(no CPU test of {method!r} exists)"
        ]
    return [
        f"vLLM {v}'s CPU backend uses Model Runner V2: on x86 it needs triton-cpu, elsewhere it refuses "
        "speculative decoding without Triton; without libiomp in LD_PRELOAD it runs significantly slower"
    ]
