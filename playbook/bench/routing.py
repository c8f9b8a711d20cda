"""The run by routing class: what specguard's router said of each request (its ``X-Specguard-Class``
and ``X-Specguard-Pool`` response headers), and the client's figures per class it named.

bench's phases are its prompt classes; the router classifies on the request's shape (temperature,
max_tokens, stream), so a phase may hold several routing classes and a routing class may span
phases. TTFT, TPOT and e2e are the client's, per request, so they split exactly. Acceptance does
not: vLLM counts drafts server-wide, and bench reads its counters before and after each phase. A
routing class gets an acceptance only when it had a phase to itself (every measured request of the
phase, and only those, in that class): then the phase's counter deltas are that class's. Run one
prompt class per request shape (the prompt file's ``class``, ``max_tokens`` and ``temperature``)
to get it; otherwise the class shows its pool and no acceptance, and says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, TextIO

from specguard.playbook.bench.client import Result
from specguard.playbook.bench.stats import distribution

UNROUTED = "(no header)"  # requests whose answer carried no X-Specguard-Class: not the router's
SHARED = (
    "its phase also held requests of other routing classes: the server counts drafts server-wide, so "
    "no acceptance is its own (give each request shape a prompt class of its own)"
)
SPLIT = "its requests were in several phases: no one phase's counters are its own"


def by_route(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Per routing class: requests, the pool(s) they went to, the prompt classes (phases) they came
    from, TTFT/TPOT/e2e, and the acceptance where a phase was the class's alone. None when no
    answer came through the router."""
    members: dict[str, list[tuple[str, Result]]] = {}
    for phase, measured in phases.items():
        for result in measured.get("results") or []:
            members.setdefault(result.route_class or UNROUTED, []).append((phase, result))
    if set(members) <= {UNROUTED}:
        return None
    classes: dict[str, Any] = {}
    for name, pairs in sorted(members.items(), key=lambda item: (-len(item[1]), item[0])):
        results = [result for _, result in pairs]
        ok = [r for r in results if r.ok]
        pools = Counter(r.route_pool or "?" for r in results)
        in_phases = sorted({phase for phase, _ in pairs})
        entry: dict[str, Any] = {
            "requests": len(results),
            "completed": len(ok),
            "pool": pools.most_common(1)[0][0] if len(pools) == 1 else None,
            "pools": dict(sorted(pools.items())),
            "phases": in_phases,
            "ttft": distribution([r.ttft for r in ok if r.ttft is not None]),
            "tpot": distribution([t for r in ok if (t := r.tpot) is not None]),
            "e2e": distribution([r.e2e for r in ok if r.e2e is not None]),
            "output_tokens": sum(r.output_tokens for r in ok),
            "acceptance": None,
        }
        if name != UNROUTED:
            _acceptance(entry, name, in_phases, phases)
        classes[name] = entry
    return {"classes": classes}


def _acceptance(entry: dict[str, Any], name: str, in_phases: list[str], phases: Mapping[str, Any]) -> None:
    if len(in_phases) > 1:
        entry["acceptance_note"] = SPLIT
        return
    (phase,) = in_phases
    if any(r.route_class != name for r in phases[phase].get("results") or []):
        entry["acceptance_note"] = SHARED
        return
    entry["acceptance"] = phases[phase].get("acceptance")
    entry["acceptance_phase"] = phase


def routing_table(routing: Mapping[str, Any], out: TextIO) -> None:
    """The run by routing class, as ``specguard bench`` prints it."""
    out.write("\nby routing class (the router's X-Specguard-Class and X-Specguard-Pool)\n")
    rows = [("ROUTING CLASS", "POOL", "OK/REQ", "PHASES", "TTFT p50/p95 ms", "TPOT p50/p95 ms",
             "E2E p50/p95 s", "ACCEPT", "MAL")]  # fmt: skip
    notes = []
    for name, entry in routing["classes"].items():
        a = entry.get("acceptance") or {}
        pools = entry["pool"] or ",".join(f"{p}:{n}" for p, n in entry["pools"].items())
        ttft, tpot, e2e = entry["ttft"], entry["tpot"], entry["e2e"]
        rows.append((
            name, pools, f"{entry['completed']}/{entry['requests']}", ",".join(entry["phases"]),
            f"{_ms(ttft['p50'])}/{_ms(ttft['p95'])}", f"{_ms(tpot['p50'])}/{_ms(tpot['p95'])}",
            "-" if e2e["p50"] is None else f"{e2e['p50']:.2f}/{e2e['p95']:.2f}",
            f"{a['rate']:.2f}" if "rate" in a else "-",
            f"{a['mean_acceptance_length']:.2f}" if "mean_acceptance_length" in a else "-",
        ))  # fmt: skip
        if "acceptance_note" in entry:
            notes.append(f"  {name}: no acceptance of its own: {entry['acceptance_note']}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")
    for line in notes:
        out.write(line + "\n")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"
