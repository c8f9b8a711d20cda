"""The serving file: what vLLM should serve and how it speculates, the one source of truth that
``specguard serve-config`` renders for a vLLM version and ``specguard tune --write`` updates.

``load_serving(path)`` reads and checks one (raising ``ServingError``, whose problems each say
``file:line: key: message``); the checks that depend on the vLLM version are in ``checks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from specguard.common.names import did_you_mean
from specguard.common.yamlfile import FileProblems, LineDict, Problem, line_of, load_yaml, validation_problems
from specguard.playbook.serve_config.versions import (
    METHODS,
    NEEDS_DRAFT,
    NO_DRAFT,
    VersionError,
    parse_version,
)

# Keys of the speculative config that the serving file gives at its top level, under their own names.
TOP_LEVEL_SPECULATIVE = {
    "method": "method",
    "model": "draft",
    "num_speculative_tokens": "num_speculative_tokens",
    "draft_tensor_parallel_size": "draft_tensor_parallel_size",
    "num_speculative_tokens_per_batch_size": "num_speculative_tokens_per_batch_size",
}
# Options the serving file's keys already give: not again in extra_args.
GENERATED_FLAGS = (
    "--speculative-config", "-sc", "--model", "--served-model-name", "--tensor-parallel-size", "-tp",
    "--gpu-memory-utilization", "--max-model-len", "--host", "--port", "--config",
    "--spec-method", "--spec-model", "--spec-tokens",
)  # fmt: skip


class ServingError(FileProblems):
    """The serving file cannot be used; every problem as ``file:line: key: message``."""


class Serving(BaseModel):
    """One serving file's content (see docs/serve-config.md for each key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vllm_version: str | None = None
    target: str = Field(min_length=1)
    served_model_name: str | None = Field(None, min_length=1)
    method: str
    draft: str | None = Field(None, min_length=1)
    num_speculative_tokens: int = Field(strict=True, gt=0)
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    draft_tensor_parallel_size: int | None = Field(None, strict=True, ge=1)
    tensor_parallel_size: int | None = Field(None, strict=True, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    max_model_len: int | None = Field(None, strict=True, ge=1)
    host: str | None = Field(None, min_length=1)
    port: int | None = Field(None, strict=True, ge=1, le=65535)
    device: Literal["cpu", "gpu"] | None = None  # only for warnings: what vLLM's CPU backend can do
    speculative_extra: dict[str, Any] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    _file: str = PrivateAttr("<serving>")
    _lines: LineDict | None = PrivateAttr(None)

    @field_validator("vllm_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f'write the version as a string in quotes, e.g. "0.32.0" (YAML read {value!r})')
        try:
            parse_version(value)
        except VersionError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        if value not in METHODS:
            raise ValueError(f"unknown speculative method {value!r}{did_you_mean(value, METHODS)}")
        return value

    @field_validator("num_speculative_tokens_per_batch_size")
    @classmethod
    def _schedule(cls, value: tuple[tuple[int, int, int], ...] | None) -> Any:
        # vLLM's own rules (vllm/v1/spec_decode/dynamic/utils.py, 0.32.0).
        if value is None:
            return None
        if not value:
            raise ValueError("give at least one [start, end, k] range, or leave the key out")
        previous_end = 0
        for start, end, k in sorted(value):
            if start <= 0 or end < start:
                raise ValueError(f"[{start}, {end}, {k}]: a range of batch sizes from 1 up, start <= end")
            if k < 0:
                raise ValueError(f"[{start}, {end}, {k}]: k must be 0 or more")
            if start <= previous_end:
                raise ValueError(f"[{start}, {end}, {k}]: the ranges overlap")
            previous_end = end
        if min(value)[0] != 1:
            raise ValueError("the first range must start at batch size 1, so every batch size has a k")
        return value

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra_args(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError('give a list of arguments, e.g. ["--enable-prefix-caching"]')
        if isinstance(value, list | tuple):
            for item in value:
                if not isinstance(item, str | int | float) or isinstance(item, bool):
                    raise ValueError(f"{item!r}: each argument is a string")
            for item in value:
                flag = str(item).split("=", 1)[0]
                if flag in GENERATED_FLAGS or flag.startswith("--speculative-config."):
                    raise ValueError(
                        f"{flag}: the serving file's own keys give it; leave it out of extra_args"
                    )
            return tuple(str(item) for item in value)
        return value

    # --- where things are, for messages ------------------------------------------------------

    @property
    def file(self) -> str:
        return self._file

    def problem(self, key: str, message: str, warning: bool = False) -> Problem:
        """A problem with ``key`` (``speculative_extra.x`` for a key inside it), at its line."""
        parts: list[str | int] = list(key.split("."))
        line = line_of(self._lines, parts) if self._lines is not None else None
        return Problem(self._file, line, key, message, warning)

    def located(self, file: str, lines: LineDict | None) -> Serving:
        self._file = file
        self._lines = lines
        return self


def parse_serving(data: Any, file: str) -> Serving:
    """A Serving from a mapping as read (a LineDict keeps the lines for messages). Raises ServingError."""
    if not isinstance(data, Mapping):
        line = getattr(data, "line", None)
        raise ServingError([Problem(file, line, "", "the serving file must be a mapping of keys")])
    try:
        serving = Serving.model_validate(dict(data))
    except ValidationError as exc:
        problems = validation_problems(file, data, exc)
        for p in problems:
            if p.field in Serving.model_fields or p.message != "unknown key":
                continue
            close = did_you_mean(p.field, Serving.model_fields)
            problems[problems.index(p)] = Problem(p.file, p.line, p.field, f"unknown key{close}")
        raise ServingError(problems) from None
    serving.located(file, data if isinstance(data, LineDict) else None)
    problems = consistency(serving)
    if problems:
        raise ServingError(problems)
    return serving


def consistency(serving: Serving) -> list[Problem]:
    """The checks across keys: the method and its draft, the speculative config's own keys."""
    problems = []
    for key in serving.speculative_extra:
        if key in TOP_LEVEL_SPECULATIVE:
            own = TOP_LEVEL_SPECULATIVE[key]
            problems.append(
                serving.problem(f"speculative_extra.{key}", f"give it as the serving file's `{own}`")
            )
    if serving.method in NEEDS_DRAFT and serving.draft is None:
        problems.append(
            serving.problem(
                "method", f"method {serving.method} needs `draft`: the draft model's path or hub id"
            )
        )
    if serving.method in NO_DRAFT and serving.draft is not None:
        problems.append(
            serving.problem("draft", f"method {serving.method} has no draft model: leave `draft` out")
        )
    return problems


def load_serving(path: Path, text: str | None = None) -> Serving:
    """Read and check the serving file at ``path`` (or ``text`` as if it were that file), without a
    vLLM version: its keys, their types and ranges, the method and its draft. Raises ServingError
    (a ``FileProblems``: ``str(error)`` is one ``file:line: key: message`` line per problem)."""
    try:
        data = load_yaml(path, text)
    except FileProblems as exc:
        raise ServingError(exc.problems) from None
    if data is None:
        raise ServingError(
            [
                Problem(
                    str(path),
                    None,
                    "",
                    "the file is empty: give at least target, method and num_speculative_tokens",
                )
            ]
        )
    return parse_serving(data, str(path))
