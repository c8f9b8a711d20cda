"""Values as the status view shows them: numbers, spans, clock times against the daemon's own
``now``, labels, matchers and sizes. Shared by the view (``statusview``), the page and the CLI."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from specguard.rules.durations import format_duration


def number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:.4g}"


def span(seconds: float) -> str:
    """``3s``, ``4m5s``, ``2h10m``, ``3d4h``: as precise as a glance needs."""
    seconds = abs(seconds)
    if seconds < 3600:
        return format_duration(round(seconds))
    if seconds < 86400:
        return format_duration(60 * round(seconds / 60))
    return format_duration(3600 * round(seconds / 3600))


def clock(at: Any, now: float) -> str:
    """``14:03:10 (3m ago)``, ``14:30:00 (in 27m)``; the date too when it is not within the day."""
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "-"
    moment = time.gmtime(at)
    shown = time.strftime("%H:%M:%S" if abs(now - at) < 72000 else "%Y-%m-%d %H:%M", moment)
    if abs(now - at) < 1:
        return f"{shown} (now)"
    return f"{shown} ({span(now - at)} ago)" if at <= now else f"{shown} (in {span(at - now)})"


def labels_text(labels: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "-"


def match_text(match: Mapping[str, Any]) -> str:
    parts = []
    for label, spec in match.items():
        if isinstance(spec, Mapping):
            ((op, value),) = spec.items()
            parts.append(f"{label}{op}{value}")
        else:
            parts.append(f"{label}={spec}")
    return ",".join(parts) or "-"


def size_text(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


__all__ = ["clock", "labels_text", "match_text", "number", "size_text", "span"]
