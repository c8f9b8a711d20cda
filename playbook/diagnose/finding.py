"""What a troubleshooting case answers: a verdict, the figures it used, the cause and the remedy."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    FINE = "fine"  # the case's symptom has no cause in the data
    SUSPECT = "suspect"  # a figure is past its line, but not enough to name the cause
    CAUSE_FOUND = "cause found"  # the cause is named, with the figures that show it
    UNKNOWN = "unknown"  # not enough data to judge: never reported as fine


@dataclass(frozen=True)
class Figure:
    """One number a verdict rests on, with its line and where it was read."""

    name: str  # e.g. "acceptance_rate", "draft_cost", "estimated_speedup"
    value: float | int | str | None  # None: not available (and ``source`` says why)
    unit: str = ""  # "", "s", "%", "x", "tokens"
    line: str = ""  # the threshold it is held to, as text: "< 0.3 collapse, < 0.5 low"
    source: str = ""  # where it was read: "history 2026-12-05 10:00-11:00", "baseline", "bench --json"
    scope: str = ""  # the series, class or pool it is about ("" for the whole server)


@dataclass(frozen=True)
class Finding:
    """One case's answer."""

    case: str  # "slower", "class_collapse", "bursty_stream", "vocab_mismatch"
    title: str  # the playbook's title of the case
    verdict: Verdict
    summary: str  # one line: the verdict in words, the cause when found
    figures: tuple[Figure, ...] = ()
    remedy: tuple[str, ...] = ()  # steps, in order; commands and config snippets as text
    missing: tuple[str, ...] = ()  # what was not available (why a verdict is unknown)
    details: dict[str, object] = field(default_factory=dict)  # anything else for --json (tables)
