"""The report's values as text: figures in their units, changes as arrows, durations and times for
people; what a missing value shows as; each figure's label and which way is better."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

# What a missing value (null: no data) shows as; "None" or "nan" would read as a value.
MISSING = "\u2013"  # an en dash
_TIMES = "\u00d7"  # the multiplication sign of "2.19x faster"

LABELS: dict[str, str] = {
    "acceptance_rate": "Acceptance rate",
    "mean_acceptance_length": "Mean acceptance length",
    "estimated_speedup": "Estimated speedup",
    "ttft_p50": "TTFT p50",
    "ttft_p95": "TTFT p95",
    "itl_p50": "Inter-token latency p50",
    "itl_p95": "Inter-token latency p95",
    "e2e_latency_p50": "End-to-end latency p50",
    "e2e_latency_p95": "End-to-end latency p95",
    "generation_throughput": "Generation throughput",
    "request_rate": "Request rate",
    "kv_cache_usage_mean": "KV-cache usage, mean",
    "kv_cache_usage_max": "KV-cache usage, max",
    "preemptions": "Preemptions",
    "drafts": "Drafts",
    "firings": "Rules fired on it",
}

_UNITS: dict[str, str] = {
    "acceptance_rate": "ratio",
    "mean_acceptance_length": "tokens",
    "estimated_speedup": "times",
    "ttft_p50": "seconds",
    "ttft_p95": "seconds",
    "itl_p50": "seconds",
    "itl_p95": "seconds",
    "e2e_latency_p50": "seconds",
    "e2e_latency_p95": "seconds",
    "generation_throughput": "tokens/s",
    "request_rate": "requests/s",
    "kv_cache_usage_mean": "ratio",
    "kv_cache_usage_max": "ratio",
    "preemptions": "count",
    "drafts": "count",
    "firings": "count",
}

# Which way is better, for colouring a change: 1 up, -1 down, 0 neither (more traffic is not
# better or worse; KV-cache usage is fine until it is not).
BETTER: dict[str, int] = {
    "acceptance_rate": 1,
    "mean_acceptance_length": 1,
    "estimated_speedup": 1,
    "ttft_p50": -1,
    "ttft_p95": -1,
    "itl_p50": -1,
    "itl_p95": -1,
    "e2e_latency_p50": -1,
    "e2e_latency_p95": -1,
    "generation_throughput": 1,
    "preemptions": -1,
    "firings": -1,
}


def as_number(value: Any) -> float | None:
    """A number from the document, or None for null (and for anything that is not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def text(value: Any) -> str:
    return MISSING if value is None or value == "" else str(value)


def value(name: str, value: Any) -> str:
    """A headline figure in its unit: seconds as ms below a second, ratios as percentages."""
    number = as_number(value)
    if number is None:
        return MISSING
    unit = _UNITS.get(name, name)  # a name or a unit
    if unit == "ratio":
        return percent(number)
    if unit == "seconds":
        return seconds(number)
    if unit == "tokens":
        return f"{number:.2f}"
    if unit == "times":
        return f"{number:.2f}{_TIMES}"
    if unit == "tokens/s":
        return f"{number:,.0f} tok/s"
    if unit == "requests/s":
        return f"{number:.2f} req/s"
    if unit == "count":
        return f"{number:,.0f}"
    return general(number)


def percent(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{ratio * 100:.1f} %"


def seconds(seconds: float) -> str:
    if abs(seconds) >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * 1000
    return f"{ms:.1f} ms" if abs(ms) < 10 else f"{ms:.0f} ms"


def fixed(value: float | None, digits: int) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def general(value: Any) -> str:
    number = as_number(value)
    return MISSING if number is None else f"{number:.4g}"


def count(value: Any) -> str:
    number = as_number(value)
    return MISSING if number is None else f"{number:,.0f}"


def change(change: Any, better: int) -> tuple[str, str]:
    """The week-over-week change as an arrow and a signed percentage, and whether it is good news."""
    number = as_number(change)
    if number is None:
        return MISSING, ""
    if abs(number) < 0.0005:
        return "→ 0.0 %", ""
    arrow = "▲" if number > 0 else "▼"
    tone = "" if not better else ("good" if (number > 0) == (better > 0) else "bad")
    return f"{arrow} {number * 100:+.1f} %", tone


def ratio(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{_TIMES}{ratio:.2f}"


def duration(value: Any) -> str:
    """Seconds for people: 1.2 s, 41 s, 3 min 20 s, 1 h 30 min, 2 d 3 h."""
    seconds = as_number(value)
    if seconds is None:
        return MISSING
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    if whole < 86400:
        hours, rest = divmod(whole, 3600)
        return f"{hours} h" + (f" {rest // 60} min" if rest // 60 else "")
    days, rest = divmod(whole, 86400)
    return f"{days} d" + (f" {rest // 3600} h" if rest // 3600 else "")


def time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)


def when(value: Any) -> str:
    """An ISO 8601 time as ``2026-12-02 14:09 UTC``; text that is not one is shown as it is."""
    at = time(value)
    if at is None:
        return text(value)
    return at.strftime("%Y-%m-%d %H:%M UTC")


def hour(value: Any) -> str:
    number = as_number(value)
    return MISSING if number is None else f"{number:02.0f}"


def day(value: Any) -> str:
    try:
        return datetime.fromisoformat(str(value)).strftime("%a %Y-%m-%d")
    except ValueError:
        return text(value)
