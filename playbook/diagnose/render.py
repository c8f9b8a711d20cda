"""What ``specguard diagnose`` prints: each case's verdict, the numbers it rests on, the remedy
and what was missing, as text or as JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Figure, Finding
from specguard.playbook.diagnose.run import CASES


def number_of(finding: Finding) -> int | None:
    return next((n for n, (_, name, _) in CASES.items() if name == finding.case), None)


def value_text(figure: Figure) -> str:
    value = figure.value
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 10):
        text = f"{value:,.0f}"
    elif figure.unit in ("%", "ms"):
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {figure.unit}".rstrip() if figure.unit not in ("x",) else f"{text}x"


def window_text(evidence: Evidence) -> str:
    def at(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))

    minutes = (evidence.end - evidence.start) / 60
    length = (
        f"{minutes / 60:.1f} h"
        if minutes >= 90
        else f"{minutes:.0f} min"
        if minutes >= 1
        else f"{minutes * 60:.0f} s"
    )
    servers = sum(1 for _ in evidence.servers)
    return (
        f"{evidence.source} {at(evidence.start)} - {at(evidence.end)} UTC ({length}), "
        f"{servers} server{'s' if servers != 1 else ''}"
        + (
            f", {len(evidence.routes)} router{'s' if len(evidence.routes) != 1 else ''}"
            if evidence.routes
            else ""
        )
    )


def _table(rows: Sequence[Sequence[str]], indent: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def text(evidence: Evidence, findings: Sequence[Finding]) -> str:
    lines = [f"specguard diagnose: {window_text(evidence)}"]
    if evidence.bench is not None:
        lines.append(f"bench result: {(evidence.bench.get('server') or {}).get('url', '?')}")
    for finding in findings:
        number = number_of(finding)
        lines += ["", f"{number}. {finding.title}: {finding.verdict.value.upper()}", f"   {finding.summary}"]
        if finding.figures:
            rows = [("FIGURE", "VALUE", "LINE", "SCOPE", "SOURCE")]
            rows += [
                (f.name, value_text(f), f.line or "-", f.scope or "-", f.source or "-")
                for f in finding.figures
            ]
            lines += _table(rows, "   ")
        table = finding.details.get("k_table")
        if isinstance(table, list) and table:
            lines.append(
                "   k table (expected speedup at each k, from the measured per-position acceptance):"
            )
            lines += [f"     {line}" for line in table]
        if finding.remedy:
            lines.append("   remedy:")
            for i, step in enumerate(finding.remedy, 1):  # a step may be lines (YAML to paste)
                first, *more = step.splitlines() or [""]
                lines.append(f"     {i}. {first}")
                lines += [f"        {line}" for line in more]
        if finding.missing:
            lines.append("   missing: " + "; ".join(finding.missing))
    return "\n".join(lines) + "\n"


def as_json(evidence: Evidence, findings: Sequence[Finding], code: int) -> str:
    out: dict[str, Any] = {
        "window": {"source": evidence.source, "start": evidence.start, "end": evidence.end,
                   "servers": [list(key) for key in evidence.servers], "routers": list(evidence.routes)},
        "notes": list(evidence.notes),
        "cases": [{"number": number_of(f), **asdict(f), "verdict": f.verdict.value} for f in findings],
        "exit_code": code,
    }  # fmt: skip
    return json.dumps(out, indent=2, default=str) + "\n"
