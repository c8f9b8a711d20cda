"""A vLLM command written for the old speculative flags (``--speculative-model``,
``--num-speculative-tokens``...: gone from vLLM 0.8.3, reference section 4) read into a serving
file's keys, with one line for each flag that has no equivalent on the target version and why.

The command is split with ``shlex``, never by a shell. What is not about speculative decoding and
not one of the serving file's own keys is kept, as written, in ``extra_args``.
"""

from __future__ import annotations

import io
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from specguard.playbook.serve_config.serving import TOP_LEVEL_SPECULATIVE
from specguard.playbook.serve_config.versions import Version, key_verdict, show

API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")

# Serving-file keys given by vLLM options of their own (the value converted with the function).
SERVING_OPTIONS: dict[str, tuple[str, type]] = {
    "--model": ("target", str),
    "--served-model-name": ("served_model_name", str),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "-tp": ("tensor_parallel_size", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--max-model-len": ("max_model_len", int),
    "--host": ("host", str),
    "--port": ("port", int),
    "--num-speculative-tokens": ("num_speculative_tokens", int),
    "--speculative-method": ("method", str),
    "--speculative-draft-tensor-parallel-size": ("draft_tensor_parallel_size", int),
}
# The old separate flags that became keys of the speculative config (checked against the version).
SPECULATIVE_OPTIONS: dict[str, tuple[str, type]] = {
    "--speculative-max-model-len": ("max_model_len", int),
    "--speculative-model-quantization": ("quantization", str),
    "--ngram-prompt-lookup-max": ("prompt_lookup_max", int),
    "--ngram-prompt-lookup-min": ("prompt_lookup_min", int),
    "--speculative-disable-by-batch-size": ("disable_by_batch_size", int),
    "--spec-decoding-acceptance-method": ("acceptance_method", str),
    "--typical-acceptance-sampler-posterior-threshold": ("posterior_threshold", float),
    "--typical-acceptance-sampler-posterior-alpha": ("posterior_alpha", float),
}
SPECULATIVE_SWITCHES: dict[str, str] = {
    "--speculative-disable-mqa-scorer": "disable_mqa_scorer",
    "--disable-logprobs-during-spec-decoding": "disable_logprobs",
}
# Flags dropped whatever the version, with the reason.
GONE: dict[str, str] = {
    "--use-v2-block-manager": "the V2 block manager became vLLM's only one and the flag went away "
    "(vLLM 0.32.0 has no such option); nothing replaces it",
}
NGRAM_MODELS = ("ngram", "[ngram]")


class LegacyError(ValueError):
    """The command cannot be read (quoting, a flag without its value, a value of the wrong type)."""


@dataclass
class Legacy:
    data: dict[str, Any]  # the serving file's keys
    dropped: list[str] = field(default_factory=list)  # one line per flag left out, with why
    notes: list[str] = field(default_factory=list)  # what was assumed


def _convert(flag: str, value: str, kind: type) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise LegacyError(f"{flag} {value!r}: not {'an integer' if kind is int else 'a number'}") from None


def _skip_launcher(words: list[str]) -> tuple[list[str], str | None]:
    """The words after the program (``vllm serve``, ``python -m vllm.entrypoints...``), and the
    model given positionally to ``vllm serve``."""
    index = 0
    while index < len(words) and "=" in words[index] and not words[index].startswith("-"):
        index += 1  # VAR=value before the program
    rest = words[index:]
    if "-m" in rest and rest.index("-m") + 1 < len(rest) and rest[rest.index("-m") + 1] in API_SERVER_MODULES:
        return rest[rest.index("-m") + 2 :], None
    if "serve" in rest:
        after = rest[rest.index("serve") + 1 :]
        if after and not after[0].startswith("-"):
            return after[1:], after[0]
        return after, None
    if rest and not rest[0].startswith("-"):
        return rest[1:], None  # a launcher of its own name
    return rest, None


def _split(command: str) -> list[str]:
    try:
        words = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        raise LegacyError(f"cannot split the command: {exc}") from None
    if not words:
        raise LegacyError("the command is empty")
    return words


def parse_legacy(command: str, version: Version) -> Legacy:
    """The serving-file keys of ``command`` for vLLM ``version`` (the version whose facts apply)."""
    words, positional = _split_words(command)
    out = Legacy(data={})
    if positional is not None:
        out.data["target"] = positional
    extra: dict[str, Any] = {}
    extra_args: list[str] = []
    speculative_model: str | None = None
    index = 0

    def value_of(flag: str, inline: str | None) -> str:
        nonlocal index
        if inline is not None:
            return inline
        if index >= len(words) or (words[index].startswith("-") and not _number(words[index])):
            raise LegacyError(f"{flag} needs a value")
        index += 1
        return words[index - 1]

    def keep_key(flag: str, key: str, value: Any) -> None:
        verdict = key_verdict(key, version)
        if verdict.status == "ok":
            extra[key] = value
        else:
            out.dropped.append(f"dropped {flag} ({key}): {verdict.reason}")

    while index < len(words):
        word = words[index]
        index += 1
        flag, sep, inline_text = word.partition("=") if word.startswith("--") else (word, "", "")
        inline = inline_text if sep else None
        if flag in GONE:
            out.dropped.append(f"dropped {flag}: {GONE[flag]}")
        elif flag in SERVING_OPTIONS:
            key, kind = SERVING_OPTIONS[flag]
            out.data[key] = _convert(flag, value_of(flag, inline), kind)
        elif flag == "--speculative-model":
            speculative_model = value_of(flag, inline)
        elif flag in SPECULATIVE_OPTIONS:
            key, kind = SPECULATIVE_OPTIONS[flag]
            keep_key(flag, key, _convert(flag, value_of(flag, inline), kind))
        elif flag in SPECULATIVE_SWITCHES:
            if inline is None and index < len(words) and words[index].lower() in ("true", "false"):
                index += 1  # an explicit boolean value, as some releases took
            keep_key(flag, SPECULATIVE_SWITCHES[flag], True)
        elif flag in ("--speculative-config", "-sc"):
            _merge_config(flag, value_of(flag, inline), out, extra, keep_key)
            speculative_model = out.data.pop("draft", speculative_model)
        else:
            extra_args.append(word)
            while index < len(words) and not words[index].startswith("-") and inline is None:
                extra_args.append(words[index])
                index += 1
    _method(out, speculative_model)
    if extra:
        out.data["speculative_extra"] = extra
    if extra_args:
        out.data["extra_args"] = extra_args
    return out


def _split_words(command: str) -> tuple[list[str], str | None]:
    return _skip_launcher(_split(command))


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _merge_config(flag: str, text: str, out: Legacy, extra: dict[str, Any], keep_key: Any) -> None:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LegacyError(f"{flag}: not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LegacyError(f"{flag}: not a JSON object")
    for key, value in config.items():
        if key in TOP_LEVEL_SPECULATIVE:
            out.data[TOP_LEVEL_SPECULATIVE[key]] = value
        else:
            keep_key(f"{flag} key", key, value)


def _method(out: Legacy, speculative_model: str | None) -> None:
    method = out.data.get("method")
    if speculative_model is not None and speculative_model.strip() in NGRAM_MODELS:
        if method not in (None, "ngram"):
            raise LegacyError(f"--speculative-model {speculative_model} is n-gram matching, not {method}")
        out.data["method"] = "ngram"
        return
    if speculative_model is not None:
        out.data["draft"] = speculative_model
        if method is None:
            out.data["method"] = "draft_model"
            out.notes.append(
                "method draft_model assumed: the old flags chose the method from the draft's own config; "
                "give --speculative-method (or edit the serving file) for eagle, medusa or mlp_speculator"
            )


def serving_yaml(data: dict[str, Any], version: Version | None, command: str) -> str:
    """The serving file for ``data``, keys in the documented order, ``vllm_version`` when known."""
    order = (
        "vllm_version", "target", "served_model_name", "method", "draft", "num_speculative_tokens",
        "num_speculative_tokens_per_batch_size", "draft_tensor_parallel_size", "tensor_parallel_size",
        "gpu_memory_utilization", "max_model_len", "host", "port", "device", "speculative_extra", "extra_args",
    )  # fmt: skip
    full = {
        **({"vllm_version": DoubleQuotedScalarString(show(version))} if version is not None else {}),
        **data,
    }
    out = CommentedMap()
    for key in order:
        if key in full:
            out[key] = full[key]
    yaml = YAML()
    yaml.width = 4096
    stream = io.StringIO()
    yaml.dump(out, stream)
    one_line = " ".join(command.split())
    return (
        "# The serving file: `specguard serve-config` renders it for a vLLM version; `specguard tune --write`\n"
        "# updates num_speculative_tokens. Written by `specguard serve-config --from-legacy` from:\n"
        f"#   {one_line}\n" + stream.getvalue()
    )
