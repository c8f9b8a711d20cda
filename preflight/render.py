"""What preflight prints: a table (each item's status, its evidence and its fix), ``--json``, and the
Markdown record ``--out`` writes for a change ticket (host, time, config, every item)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from specguard.preflight.item import ItemResult, Status

WIDTH = 100
MARKS = {Status.PASS: "PASS", Status.FAIL: "FAIL", Status.UNKNOWN: "UNKNOWN"}


@dataclass(frozen=True)
class Header:
    host: str
    at: float  # epoch seconds
    config: str  # the config file, or "<defaults>"
    version: str  # specguard's
    allow_unknown: bool
    only: tuple[str, ...] = ()  # --only: the items checked, when not all of them

    @property
    def time(self) -> str:
        return datetime.fromtimestamp(self.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def counts(results: Sequence[ItemResult]) -> dict[str, int]:
    return {status.value: sum(1 for r in results if r.answer.status is status) for status in Status}


def verdict(results: Sequence[ItemResult], passed: bool, allow_unknown: bool) -> str:
    found = counts(results)
    said = ", ".join(f"{n} {status}" for status, n in found.items() if n)
    if passed:
        unknown = " (unknown allowed)" if allow_unknown and found["unknown"] else ""
        return f"preflight passed: {said}{unknown}"
    return f"preflight FAILED: {said}"


def table(header: Header, results: Sequence[ItemResult], passed: bool) -> str:
    only = f", only {', '.join(header.only)}" if header.only else ""
    lines = [f"specguard preflight on {header.host} at {header.time} ({header.config}{only})", ""]
    width = max((len(f"{r.number:>2}. {r.title}") for r in results), default=0)
    for r in results:
        name = f"{r.number:>2}. {r.title}"
        lines.append(f"{name:<{width}}  {MARKS[r.answer.status]}")
        for fact in r.answer.evidence:
            lead = " " * (len(fact) - len(fact.lstrip(" ")))  # a fact about the one above it
            lines += textwrap.wrap(fact.lstrip(" "), WIDTH, initial_indent=f"      {lead}",
                                   subsequent_indent=f"      {lead}    ")  # fmt: skip
        if r.answer.fix:
            lines += textwrap.wrap(r.answer.fix, WIDTH, initial_indent="      fix: ", subsequent_indent="           ",
                                   break_on_hyphens=False, break_long_words=False)  # fmt: skip
    lines += ["", verdict(results, passed, header.allow_unknown)]
    return "\n".join(lines) + "\n"


def to_json(header: Header, results: Sequence[ItemResult], passed: bool) -> dict[str, Any]:
    return {
        "host": header.host,
        "time": header.time,
        "config": header.config,
        "specguard_version": header.version,
        "allow_unknown": header.allow_unknown,
        "only": list(header.only),
        "passed": passed,
        "counts": counts(results),
        "items": [
            {
                "number": r.number,
                "key": r.key,
                "title": r.title,
                "status": r.answer.status.value,
                "evidence": list(r.answer.evidence),
                "fix": r.answer.fix,
            }
            for r in results
        ],
    }


def markdown(header: Header, results: Sequence[ItemResult], passed: bool) -> str:
    """The record for a change ticket: who ran what where and when, and every item with its proof."""
    lines = [
        f"# Preflight of speculative decoding on {header.host}",
        "",
        f"- **Result:** {verdict(results, passed, header.allow_unknown)}",
        f"- **Host:** {header.host}",
        f"- **Time:** {header.time}",
        f"- **Config:** `{header.config}`",
        f"- **specguard:** {header.version}",
        *([f"- **Checked:** only {', '.join(header.only)} (--only)"] if header.only else []),
        "",
        "| # | item | status |",
        "|---|---|---|",
    ]
    lines += [f"| {r.number} | {_cell(r.title)} | **{r.answer.status.value}** |" for r in results]
    for r in results:
        lines += ["", f"## {r.number}. {r.title}: {r.answer.status.value}", ""]
        lines += [
            ("  - " if fact.startswith(" ") else "- ") + _inline(fact.lstrip(" "))
            for fact in r.answer.evidence
        ]
        if not r.answer.evidence:
            lines.append("- (no evidence)")
        if r.answer.fix:
            lines += ["", "Fix:", "", "```", r.answer.fix, "```"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _inline(text: str) -> str:
    """Evidence as Markdown text: what would read as markup is escaped."""
    for char in ("\\", "*", "_", "`", "<", "[", "]"):
        text = text.replace(char, "\\" + char)
    return text
