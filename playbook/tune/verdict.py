"""What the sweep found: the measured speedup of each k per class (against the plain reference),
the predicted one beside it, the k to run and, over a concurrency sweep, the k for each batch size.

A k's score at one concurrency is the geometric mean over the classes of its speed (1 / pooled
TPOT): each class counts the same whatever its token counts, and the ranking needs no plain
reference. Scores within TIE of the best are a tie, which goes to the smaller k (it drafts less,
and loses less when acceptance drops)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from specguard.playbook.tune.batches import schedule, supported
from specguard.playbook.tune.measure import Figures, Run
from specguard.playbook.tune.predict import Prediction

# Two k values whose measured speed differs by less than this are not told apart: a run's pooled
# TPOT moves by about 1 % between identical runs (hundreds of draft steps per class).
TIE = 0.01


@dataclass
class Verdict:
    ks: tuple[int, ...]
    concurrency: tuple[int, ...]
    runs: Mapping[int, Mapping[int, Run]]  # k -> concurrency -> run
    reference: Mapping[int, Run]  # concurrency -> the plain run (empty without a reference)
    predictions: Mapping[str, Prediction]
    best: dict[int, int] = field(default_factory=dict)  # concurrency -> best measured k
    version: str | None = None

    @property
    def primary(self) -> int:
        return self.concurrency[0]

    @property
    def recommended(self) -> int:
        return self.best[self.primary]

    def bursts(self, concurrency: int) -> dict[str, dict[str, float]]:
        """The runs at ``concurrency`` whose streams arrived in bursts: k (or "off") -> class -> share."""
        runs = {str(k): by[concurrency] for k, by in self.runs.items() if concurrency in by}
        if concurrency in self.reference:
            runs["off"] = self.reference[concurrency]
        return {k: found for k, run in runs.items() if (found := run.bursts())}

    def time_per_token(self, figures: Figures, concurrency: int) -> float | None:
        """What the speeds at ``concurrency`` are compared by: the pooled TPOT, or, when any run there
        came in bursts, the whole request's time per token (the same measure for every k)."""
        return figures.pooled_e2e if self.bursts(concurrency) else figures.pooled_tpot

    def measured(self, k: int, concurrency: int, klass: str) -> float | None:
        """The plain run's time per output token over this k's: how much faster it decodes than
        without speculation."""
        plain = self.reference.get(concurrency)
        run = self.runs.get(k, {}).get(concurrency)
        if plain is None or run is None or klass not in run.classes or klass not in plain.classes:
            return None
        a = self.time_per_token(run.classes[klass], concurrency)
        b = self.time_per_token(plain.classes[klass], concurrency)
        return b / a if a and b else None

    def predicted(self, k: int, klass: str, concurrency: int | None = None) -> float | None:
        """The predicted speedup of k, at the concurrency the prediction was made at (the primary):
        its p_i and c come from that level's runs, and (1 + Σ p_i) / (1 + k c) leaves out how the
        batch's verification cost grows with k, so at other levels it is not a prediction (None)."""
        if concurrency is not None and concurrency != self.primary:
            return None
        found = self.predictions.get(klass)
        return found.speedup(k) if found is not None and k <= found.measured_k else None

    def score(self, k: int, concurrency: int) -> float:
        run = self.runs[k][concurrency]
        times = [self.time_per_token(f, concurrency) for f in run.classes.values()]
        speeds = [1 / t for t in times if t]
        return math.exp(sum(math.log(s) for s in speeds) / len(speeds)) if speeds else 0.0

    def predicted_best(self) -> int | None:
        """The sweep's k with the highest predicted speedup (geometric mean over the classes)."""
        if not self.predictions:
            return None
        means = {
            k: math.exp(
                sum(math.log(p.speedup(k)) for p in self.predictions.values()) / len(self.predictions)
            )
            for k in self.ks
        }
        top = max(means.values())
        return min(k for k, value in means.items() if value >= top * (1 - TIE))

    @property
    def schedule(self) -> list[list[int]] | None:
        """The per-batch-size schedule: with several concurrency levels on vLLM 0.25 or later."""
        if len(self.concurrency) < 2 or not supported(self.version):
            return None
        return schedule(self.best)


def decide(verdict: Verdict) -> Verdict:
    for concurrency in verdict.concurrency:
        scores = {k: verdict.score(k, concurrency) for k in verdict.ks}
        top = max(scores.values())
        verdict.best[concurrency] = min(k for k, value in scores.items() if value >= top * (1 - TIE))
    first = verdict.runs[verdict.ks[-1]][verdict.primary]
    verdict.version = first.vllm_version
    return verdict
