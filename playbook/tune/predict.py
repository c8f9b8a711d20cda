"""The predicted speedup at every k from one run at the largest k.

vLLM's per-position counters give p_i, the share of drafts whose tokens 0..i were all accepted, and
p_i for i < k' is the same counter whether the server drafts k' tokens or more: one run at the
largest k of the sweep measures every smaller k's acceptance. With the draft's cost c, the speedup
at k is (1 + Σ_{i<k} p_i) / (1 + k·c) (metrics/speedup.py, the weekly report's own arithmetic), and
its k table is said as the report says it (metrics/ktable.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specguard.metrics.ktable import k_inputs, k_table
from specguard.metrics.speedup import BestK, best_k, speedup_at
from specguard.playbook.tune.measure import Run


@dataclass(frozen=True)
class Prediction:
    """One class's prediction: its p_i (measured at ``measured_k``), c and where c came from."""

    klass: str
    per_position: tuple[float, ...]
    cost: float
    cost_source: str
    measured_k: int
    best: BestK

    def speedup(self, k: int) -> float:
        return speedup_at(self.per_position, k, self.cost) if k > 0 else 1.0

    def lines(self) -> list[str]:
        """The report's k table for this class: inputs, formula, one line per k."""
        return [
            *k_inputs(self.per_position, self.cost, self.cost_source),
            *k_table(self.best, self.per_position),
        ]


def predict(
    largest: Run, costs: Mapping[str, float], cost_source: str, current_k: int | None
) -> dict[str, Prediction]:
    """Per class of the run at the largest k: its prediction for k = 1..that k, with ``costs[class]``
    (or ``costs["*"]``, one c for every class). A class without drafts is left out."""
    out: dict[str, Prediction] = {}
    for klass, figures in largest.classes.items():
        cost = costs.get(klass, costs.get("*"))
        positions = figures.per_position[: largest.k]
        if cost is None or not positions or figures.drafts <= 0:
            continue
        shown = current_k if current_k is not None and 1 <= current_k <= largest.k else None
        out[klass] = Prediction(
            klass, tuple(positions), cost, cost_source, largest.k,
            best_k(positions, cost, k_max=largest.k, current_k=shown),
        )  # fmt: skip
    return out
