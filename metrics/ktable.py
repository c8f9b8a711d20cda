"""The k table as text: the inputs of the speedup model and the expected speedup at each k.

The weekly report's ``num_speculative_tokens`` recommendation and ``specguard tune``'s predicted
column say it the same way, from metrics/speedup.py's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from specguard.metrics.speedup import BestK, tail_rate


def fmt(number: float) -> str:
    """3 significant digits; large counts whole, with thousands separators."""
    if abs(number) >= 1000:
        return f"{number:,.0f}"
    return f"{number:.3g}"


def k_inputs(per_position: Sequence[float], cost: float, source: object) -> list[str]:
    """The measured p_i, the draft's cost (and where it came from) and the formula, one line each."""
    last = len(per_position) - 1
    return [
        f"Measured per-position acceptance p_0..p_{last} (share of drafts whose tokens 0..i were all "
        f"accepted): {', '.join(fmt(p) for p in per_position)}.",
        f"Draft cost c = {fmt(cost)}" + (f" ({source})." if source else "."),
        "Expected speedup with k speculative tokens: (1 + Σ_{i<k} p_i) / (1 + k·c) (Leviathan et al., "
        "Theorem 3.8, with the measured p_i in place of alpha^(i+1)).",
    ]


def k_table(result: BestK, per_position: Sequence[float]) -> list[str]:
    """One line per k (marked extrapolated, current, best), after a line on the extrapolation if any."""
    lines: list[str] = []
    if any(row.extrapolated for row in result.table):
        lines.append(
            f"Past k = {len(per_position)} the p_i are extrapolated: each further position keeps "
            f"{fmt(tail_rate(per_position))} of the one before (the mean conditional acceptance of the "
            "last measured positions)."
        )
    for row in result.table:
        marks = [
            mark
            for mark, applies in (
                ("extrapolated", row.extrapolated),
                ("current", row.k == result.current_k),
                ("best", row.k == result.k),
            )
            if applies
        ]
        lines.append(f"k = {row.k}: speedup {fmt(row.speedup)}" + (f" ({', '.join(marks)})" if marks else ""))
    return lines
