"""The command line as vLLM 0.32's ``FlexibleArgumentParser`` rewrites it before argparse sees it.

Two rewrites matter to the simulator (``vllm/utils/argparse_utils.py``):

- ``--max_num_seqs`` means ``--max-num-seqs``: underscores become dashes in an option's name (the
  part before any dot).
- A JSON option can be given key by key: ``--speculative-config.method ngram
  --speculative-config.num_speculative_tokens 3`` (also ``-sc.KEY``, ``--opt.KEY=VALUE``, nested
  ``--opt.a.b VALUE``, and ``--opt.KEY+ a,b`` for a list). Each value is read as JSON, else as a
  human-readable integer (``1k``, ``2K``), else kept as a string. All the dotted parts of one option
  are merged into one JSON object, which is appended **after** every other argument. argparse keeps
  the last value of an option, so the dotted object *replaces* a whole ``--speculative-config
  '{...}'`` given on the same command line (keys are not merged across the two forms), and both
  replace the ``speculative-config`` of a ``--config`` file. A dotted key given twice keeps its last
  value and is reported as a duplicate.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from typing import Any

_NAME_BEFORE_DOT = re.compile(r"(?<=--)[^.]*")
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """``1k`` -> 1000, ``1K`` -> 1024, ``25.6k`` -> 25600, ``7`` -> 7. Raises ValueError."""
    text = text.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(f"decimals are not allowed with binary suffixes like {suffix}")
    return int(number) * _BINARY[suffix]


def _dotted_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return human_readable_int(text)
        except ValueError:
            return text


def _merge(into: dict[str, Any], update: dict[str, Any], prefix: str, duplicates: list[str]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value, f"{prefix}{key}.", duplicates)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] += value
        else:
            if key in into:
                duplicates.append(prefix + key)
            into[key] = value


def rewrite(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` as vLLM's parser hands it to argparse, and the duplicate dotted keys it found.

    Raises argparse.ArgumentTypeError when a dotted option has no value.
    """
    renamed: list[str] = []
    for arg in argv:
        if arg.startswith("--"):
            name, equals, value = arg.partition("=")
            name = _NAME_BEFORE_DOT.sub(lambda m: m.group(0).replace("_", "-"), name, count=1)
            renamed.append(name + equals + value)
        else:
            renamed.append(arg)

    out: list[str] = []
    objects: dict[str, dict[str, Any]] = {}
    duplicates: list[str] = []
    i = 0
    while i < len(renamed):
        arg = renamed[i]
        name, equals, value = arg.partition("=")
        if not (arg.startswith("-") and "." in name):
            out.append(arg)
            i += 1
            continue
        if not equals:
            if i + 1 >= len(renamed):
                raise argparse.ArgumentTypeError(f"{arg}: expected a value")
            value = renamed[i + 1]
            i += 1
        i += 1
        if name.endswith("+"):
            name = name[:-1]
            value = json.dumps(value.split(","))
        option, *keys = name.split(".")
        nested: Any = _dotted_value(value)
        for key in reversed(keys):
            nested = {key: nested}
        _merge(objects.setdefault(option, {}), nested, f"{option}.", duplicates)
    for option, obj in objects.items():
        out += [option, json.dumps(obj)]
    return out, duplicates
