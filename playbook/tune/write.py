"""What ``--write`` updates: the serving file (``num_speculative_tokens``, and
``num_speculative_tokens_per_batch_size`` when a schedule is recommended; every other key and
comment kept, ruamel round trip, written atomically) and the baseline file (bench's entry for the
model, measured at the chosen k). The serving file is checked before the sweep starts, so a bad
one stops the command before anything changes."""

from __future__ import annotations

import io
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from specguard.common.files import write_atomically
from specguard.playbook.serve_config.serving import ServingError, load_serving

K = "num_speculative_tokens"
PER_BATCH = "num_speculative_tokens_per_batch_size"


class ServingFileError(Exception):
    """The serving file cannot be read or updated; the message names the file, line and key."""


def _yaml() -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def load(path: Path) -> CommentedMap:
    """The serving file, checked as ``specguard serve-config`` checks it (``load_serving``: its keys,
    their types and ranges, the method and its draft, the schedule by vLLM's rules), and read for a
    round trip that keeps its comments."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ServingFileError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    _check(path, text)
    try:
        data = _yaml().load(text)
    except YAMLError as exc:  # load_serving read it: only a ruamel-specific failure lands here
        raise ServingFileError(f"{path}: not YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, CommentedMap):
        raise ServingFileError(f"{path}: not a mapping of serving settings (see docs/serve-config.md)")
    return data


def _check(path: Path, text: str) -> None:
    try:
        load_serving(path, text)
    except ServingError as exc:
        raise ServingFileError(str(exc)) from None


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
    _check(path, out.getvalue())  # what is written must still be a serving file serve-config reads
    try:
        write_atomically(path, out.getvalue(), keep_previous=False)
    except OSError as exc:
        raise ServingFileError(f"{path}: cannot write it: {exc.strerror or exc}") from None
    return f"{path}: " + ", ".join(said)
