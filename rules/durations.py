"""Durations written the Prometheus way: ``90s``, ``10m``, ``1h30m``, ``500ms``."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: object) -> float:
    """Seconds in ``value``: a number of seconds, or a string like ``1h30m``.

    Raises ValueError with a message fit for an operator.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"a duration must be a finite number of seconds, got {value!r}")
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")
    text = value.strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(
            f"invalid duration {value!r}: use a number with a unit (ms, s, m, h, d, w), e.g. 30s, 5m, 1h30m"
        )
    return total


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for ``seconds`` (whole milliseconds)."""
    millis = round(seconds * 1000)
    if millis <= 0:
        return "0s"
    out = []
    for unit, size in (
        ("w", 604_800_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ):
        count, millis = divmod(millis, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


def format_wait(seconds: float) -> str:
    """A wait as an operator reads it: whole seconds from a second up, milliseconds below."""
    return format_duration(seconds if seconds < 1 else round(seconds))


def _validate(value: object) -> float:
    return parse_duration(value)


def _interval(seconds: float) -> float:
    if seconds < 0.1:
        raise ValueError("an interval must be at least 100ms")
    return seconds


# Pydantic field types: accept ``30s``/``5m``/numbers, hold seconds as a float.
Duration = Annotated[float, BeforeValidator(_validate)]
Interval = Annotated[float, BeforeValidator(_validate), AfterValidator(_interval)]
