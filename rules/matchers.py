"""Label matchers, as Prometheus writes them: ``=``, ``!=``, ``=~`` and ``!~``.

In a rule they are a mapping from label name to a value (equality) or to ``{op: value}``::

    match:
      position: "0"                 # position="0"
      engine: {"=~": "0|1"}         # engine=~"0|1"
      model_name: {"!=": "canary"}  # model_name!="canary"

Regular expressions are anchored at both ends, as in Prometheus (``0|1`` matches "0" and "1", not
"10"). A label a series does not have matches as the empty string, as in Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPS = ("=", "!=", "=~", "!~")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if not _LABEL.match(self.label):
            raise ValueError(f"{self.label!r} is not a label name")
        if self.op not in OPS:
            raise ValueError(f"unknown matcher operator {self.op!r}; use one of {', '.join(OPS)}")
        if self.op in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(
                    f"{self.label}{self.op}{self.value!r}: invalid regular expression: {exc}"
                ) from None

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.label, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found

    def promql(self) -> str:
        """``label="value"`` with PromQL string escaping."""
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.label}{self.op}"{escaped}"'

    def __str__(self) -> str:
        return self.promql()


def parse_matchers(value: Any) -> tuple[Matcher, ...]:
    """Matchers from a rule's ``match:`` mapping. Raises ValueError naming the problem."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError('`match` is a mapping of label: value, e.g. {position: "0"}')
    out: list[Matcher] = []
    for label, spec in value.items():
        if isinstance(spec, Mapping):
            if len(spec) != 1:
                raise ValueError(f'{label}: give one operator and value, e.g. {{"=~": "0|1"}}')
            ((op, operand),) = spec.items()
            if not isinstance(operand, str | int):
                raise ValueError(f"{label}: the value of {op!r} must be a string")
            out.append(Matcher(str(label), str(op), str(operand)))
        elif isinstance(spec, str | int) and not isinstance(spec, bool):
            out.append(Matcher(str(label), "=", str(spec)))
        else:
            raise ValueError(f"{label}: expected a string or {{op: value}}, got {spec!r}")
    return tuple(out)


def all_match(matchers: tuple[Matcher, ...] | list[Matcher], labels: Mapping[str, str]) -> bool:
    return all(matcher.matches(labels) for matcher in matchers)
