"""What ``--write`` updates: the serving file (``num_speculative_tokens``, and
``num_speculative_tokens_per_batch_size`` when a schedule is recommended; every other key and
comment kept, ruamel round trip, written atomically) and the baseline file (bench's entry for the
model, measured at the chosen k). The serving file is checked before the sweep starts, so a bad
one stops the command before anything changes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from specguard.common.files import write_atomically

K = "num_speculative_tokens"
PER_BATCH = "num_speculative_tokens_per_batch_size"


class ServingFileError(Exception):
    """The serving file cannot be read or updated; the message names the file, line and key."""


def _yaml() -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _line(data: CommentedMap, key: str) -> int:
    return int(data.lc.key(key)[0]) + 1


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load(path: Path) -> CommentedMap:
    """The serving file, checked: a mapping, ``num_speculative_tokens`` a whole number > 0, and
    ``num_speculative_tokens_per_batch_size`` (when there) a list of [start, end, k]."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ServingFileError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = _yaml().load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ServingFileError(f"{where}: not YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, CommentedMap):
        raise ServingFileError(f"{path}: not a mapping of serving settings (see docs/tune.md)")
    if K not in data:
        raise ServingFileError(f"{path}: {K}: missing (a whole number > 0)")
    if not _whole(data[K]) or data[K] <= 0:
        raise ServingFileError(f"{path}:{_line(data, K)}: {K}: {data[K]!r} is not a whole number > 0")
    if PER_BATCH in data and data[PER_BATCH] is not None:
        table = data[PER_BATCH]
        if not isinstance(table, list) or not all(
            isinstance(row, list) and len(row) == 3 and all(_whole(v) for v in row) for row in table
        ):
            raise ServingFileError(
                f"{path}:{_line(data, PER_BATCH)}: {PER_BATCH}: a list of [start, end, k] whole numbers"
            )
    return data


def update(path: Path, k: int, per_batch: list[list[int]] | None) -> str:
    """Set k (and the schedule) in ``path``, written atomically; returns what changed."""
    data = load(path)
    before = data[K]
    data[K] = k
    said = [f"{K} {before} -> {k}"]
    if per_batch is not None:
        rows = CommentedSeq()
        for row in per_batch:
            flow = CommentedSeq(row)
            flow.fa.set_flow_style()
            rows.append(flow)
        data[PER_BATCH] = rows
        said.append(f"{PER_BATCH} {str(per_batch).replace(' ', '')}")
    out = io.StringIO()
    _yaml().dump(data, out)
    try:
        write_atomically(path, out.getvalue(), keep_previous=False)
    except OSError as exc:
        raise ServingFileError(f"{path}: cannot write it: {exc.strerror or exc}") from None
    return f"{path}: " + ", ".join(said)
