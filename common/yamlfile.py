"""YAML loading that remembers where every key and list item came from.

Errors in specguard's own files are reported as ``file:line: field: message``. PyYAML keeps the
position of every node while composing; this loader copies the line of each mapping key and list
item onto the constructed containers so that a validation error's location (a path like
``("rules", 2, "condition")``) can be turned back into a line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file, in ``file:line: field: message`` form."""

    file: str
    line: int | None
    field: str
    message: str
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        prefix = "warning: " if self.warning else ""
        field = f"{self.field}: " if self.field else ""
        return f"{where}: {prefix}{field}{self.message}"


class FileProblems(Exception):
    """Raised when a file cannot be used; carries every problem found."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class LineDict(dict[Any, Any]):
    """A dict that knows the line of each key (1-based) and of itself."""

    line: int = 0
    key_lines: dict[Any, int]


class LineList(list[Any]):
    """A list that knows the line of each item (1-based) and of itself."""

    line: int = 0
    item_lines: list[int]


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in result.key_lines:
            raise yaml.MarkedYAMLError(
                problem=f"duplicate key {key!r} (first at line {result.key_lines[key]})",
                problem_mark=key_node.start_mark,
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(path: Path, text: str | None = None, label: str | None = None) -> Any:
    """Parse ``path`` (or ``text`` as if it were that file). Raises FileProblems.

    ``label`` names the file in messages (default: the path).
    """
    name = label or str(path)
    try:
        if text is None:
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FileProblems([Problem(name, None, "", f"cannot read file: {exc}")]) from None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise FileProblems([Problem(name, line, "", f"invalid YAML: {message}")]) from None
    except yaml.YAMLError as exc:
        raise FileProblems([Problem(name, None, "", f"invalid YAML: {exc}")]) from None


def line_of(data: Any, loc: Sequence[int | str]) -> int | None:
    """The line of the deepest element of ``loc`` that exists in ``data``."""
    line: int | None = getattr(data, "line", None) or None
    node = data
    for part in loc:
        if isinstance(node, LineDict) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, LineList) and isinstance(part, int) and 0 <= part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            break
    return line


def field_path(loc: Sequence[int | str]) -> str:
    """``("rules", 2, "condition")`` -> ``rules[2].condition``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_problems(file: str, data: Any, error: Any, prefix: Sequence[int | str] = ()) -> list[Problem]:
    """Turn a pydantic ValidationError on ``data`` into Problems with lines."""
    problems = []
    for item in error.errors(include_url=False):
        loc = [*prefix, *(part for part in item["loc"] if not _is_union_tag(part))]
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(Problem(file, line_of(data, loc), field_path(loc), message))
    return problems


def _is_union_tag(part: int | str) -> bool:
    # pydantic adds the union member's type name to the location ("function-after[...]"): not a field.
    return isinstance(part, str) and ("[" in part or part in {"str", "float", "int"})
