"""Conditions: ``< 0.5``, ``>= 0.95``, ``> 1.2 * baseline.e2e_latency_p95``.

A condition compares a signal's value with a threshold. The threshold is a number, or a multiple of
a value from the measured baseline (``baseline.<signal>``), resolved at evaluation time.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_SYNTAX = re.compile(
    rf"""^\s*(?P<op><=|>=|==|!=|<|>)\s*
    (?:
        (?P<number>{_NUMBER})\s*$
      | (?:(?P<factor>{_NUMBER})\s*\*\s*)?baseline\.(?P<name>[a-z][a-z0-9_]*)
        (?:\s*\*\s*(?P<factor_after>{_NUMBER}))?\s*$
    )""",
    re.VERBOSE,
)


class MissingBaseline(LookupError):
    """The condition refers to a baseline value that is not available."""


@dataclass(frozen=True)
class Condition:
    op: str
    constant: float | None = None  # threshold when not baseline-relative
    factor: float = 1.0
    baseline_signal: str | None = None
    text: str = ""

    def threshold(self, baseline: Mapping[str, float] | None) -> float:
        """The number to compare against. Raises MissingBaseline when it cannot be known."""
        if self.baseline_signal is None:
            assert self.constant is not None
            return self.constant
        if baseline is None:
            raise MissingBaseline(
                f"condition {self.text!r} needs a baseline, and no baseline file is configured "
                "(set `baseline:` in the config, written by the benchmark)"
            )
        if self.baseline_signal not in baseline:
            raise MissingBaseline(
                f"the baseline has no value for {self.baseline_signal!r} (condition {self.text!r})"
            )
        return self.factor * baseline[self.baseline_signal]

    def breached(self, value: float, threshold: float) -> bool:
        return _OPS[self.op](value, threshold)

    def __str__(self) -> str:
        return self.text


def parse_condition(text: str) -> Condition:
    """Parse a condition string. Raises ValueError with the accepted forms."""
    match = _SYNTAX.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"invalid condition {text!r}: write an operator (<, <=, >, >=, ==, !=) and a number "
            "or a baseline reference, e.g. '< 0.5' or '> 1.2 * baseline.e2e_latency_p95'"
        )
    op = match.group("op")
    clean = " ".join(text.split())
    if match.group("number") is not None:
        return Condition(op=op, constant=float(match.group("number")), text=clean)
    if match.group("factor") and match.group("factor_after"):
        raise ValueError(f"invalid condition {text!r}: give the baseline factor once")
    factor = float(match.group("factor") or match.group("factor_after") or 1.0)
    return Condition(op=op, factor=factor, baseline_signal=match.group("name"), text=clean)
