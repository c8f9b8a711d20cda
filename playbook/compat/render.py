"""The report as a table for a terminal, and as JSON (``--json``)."""

from __future__ import annotations

from typing import Any

from specguard.playbook.compat.verdicts import Report, Verdict

SCHEMA = 1
MARKS = {Verdict.OK: "ok", Verdict.WARNING: "WARNING", Verdict.INCOMPATIBLE: "INCOMPATIBLE"}


def table(report: Report) -> str:
    lines = [
        f"target: {report.target.name}" + _where(report.target.name, report.target.path),
        f"draft:  {report.draft.name}" + _where(report.draft.name, report.draft.path),
        f"method: {report.method} ({report.method_source})",
        "",
    ]
    rows = [(c.area, c.name, MARKS[c.verdict], c.evidence) for c in report.checks]
    headers = ("area", "check", "verdict", "evidence")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(3)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers[:3], widths, strict=True)) + "  " + headers[3])
    for check, row in zip(report.checks, rows, strict=True):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row[:3], widths, strict=True)) + "  " + row[3])
        indent = " " * (sum(widths) + 6)
        lines.extend(f"{indent}  {detail}" for detail in check.details)
    counts = report.counts()
    lines += [
        "",
        f"verdict: {report.verdict.value} ({counts['ok']} ok, {counts['warning']} warning, "
        f"{counts['incompatible']} incompatible); exit {report.exit_code}",
    ]
    return "\n".join(lines)


def to_json(report: Report) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "target": {"name": report.target.name, "path": report.target.path, "source": report.target.source},
        "draft": {"name": report.draft.name, "path": report.draft.path, "source": report.draft.source},
        "method": report.method,
        "method_source": report.method_source,
        "verdict": report.verdict.value,
        "exit_code": report.exit_code,
        "counts": report.counts(),
        "checks": [
            {
                "area": c.area,
                "name": c.name,
                "verdict": c.verdict.value,
                "evidence": c.evidence,
                "details": list(c.details),
                "data": c.data,
            }
            for c in report.checks
        ],
    }


def _where(name: str, path: str) -> str:
    return "" if name == path else f" ({path})"
