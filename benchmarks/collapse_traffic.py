"""The collapse detector benchmark's traffic: windows of vLLM's speculative-decoding counters drawn
from the simulator's model (sim.model) with numpy, many drafts at a time, instead of running the
simulator; tests/unit/daemon/test_collapse_bench_traffic.py holds the two to the same laws."""

from __future__ import annotations

import math

import numpy as np

from specguard.sim.model import beta_parameters

WINDOW = 5.0  # the shipped detector's interval, a window per evaluation
STEPS_PER_SECOND = 10.0  # drafts a request makes a second (Poisson)
MEAN_LIFE = 30.0  # seconds a request lasts, on average
HEAVY_SIGMA = 1.5  # the lognormal's sd of log: median 10 s, 1 in 100 over 5 minutes, same mean
SPREAD = 0.1  # sd of a request's own acceptance
LOADS = {"32 requests": 32, "16 requests": 16, "4 requests": 4}  # in flight
IN_CONTROL = 0.75


def request_factors(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Each request's acceptance over the configured level, ``sim.model.request_factor``'s law: its
    own level drawn from a Beta of mean IN_CONTROL and spread SPREAD, over IN_CONTROL."""
    a, b = beta_parameters(IN_CONTROL, SPREAD)
    return rng.beta(a, b, shape) / IN_CONTROL


def accepted_tokens(rng: np.random.Generator, alpha: np.ndarray, k: int) -> np.ndarray:
    """Accepted tokens of one chain draft of k tokens per entry of ``alpha``:
    ``sim.model.sample_accepted``'s law for the conditional acceptances ``[alpha] * k`` (positions
    tried in order until the first rejection), a geometric number of successes capped at k. The
    simulator caps level x factor at 1, as this does."""
    p_reject = 1.0 - np.minimum(alpha, 1.0 - 1e-12)
    return np.minimum(rng.geometric(p_reject) - 1, k)


class Traffic:
    """Windows of vLLM's counters from the simulator's model, a chunk at a time."""

    def __init__(
        self, rng: np.random.Generator, k: int, slots: int, window: float = WINDOW, heavy: bool = False
    ) -> None:
        self.rng, self.k, self.slots, self.heavy = rng, k, slots, heavy
        self.life = MEAN_LIFE / window  # in windows
        self.drafts = STEPS_PER_SECOND * window
        self.factors = request_factors(rng, slots)
        self.remaining = self._lives(slots)

    def _lives(self, n: int) -> np.ndarray:
        """Windows each of ``n`` new requests lasts (heavy: lognormal of mean ``life``, at least 1)."""
        if not self.heavy:
            return np.zeros(n)  # unused: a geometric life is a coin tossed every window
        mu = math.log(self.life) - HEAVY_SIGMA**2 / 2
        return np.maximum(1.0, np.round(self.rng.lognormal(mu, HEAVY_SIGMA, n)))

    def starts(self, n: int) -> np.ndarray:
        """(n, slots): whether a new request takes the slot at each of the next n windows."""
        if not self.heavy:
            return self.rng.random((n, self.slots)) < 1.0 / self.life
        starts = np.zeros((n, self.slots), dtype=bool)
        for w in range(n):
            self.remaining -= 1
            ended = self.remaining <= 0
            if ended.any():
                starts[w] = ended
                self.remaining[ended] = self._lives(int(ended.sum()))
        return starts

    def windows(
        self, levels: np.ndarray, cut: np.ndarray | None = None, after: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Counts of ``len(levels)`` windows, window w at acceptance level ``levels[w]`` (times each
        request's factor); ``cut[w]``: the share of window w's drafts made before the level
        became ``after[w]`` (a drop in the middle of a window, the same requests on both sides)."""
        n = len(levels)
        rng, slots = self.rng, self.slots
        new = self.starts(n)
        draws = request_factors(rng, (n, slots))
        index = np.where(new, np.arange(n)[:, None], -1)
        index = np.maximum.accumulate(index, axis=0)
        factors = np.where(index >= 0, draws[np.clip(index, 0, None), np.arange(slots)], self.factors)
        self.factors = factors[-1]
        parts = [(levels, np.ones(n) if cut is None else cut)]
        if cut is not None and after is not None:
            parts.append((after, 1.0 - cut))
        window_of_cell = np.repeat(np.arange(n), slots)
        accepted_sum, drafts_sum, whole_sum = np.zeros(n), np.zeros(n), np.zeros(n)
        for level, share in parts:
            drafts = rng.poisson(self.drafts * np.broadcast_to(share[:, None], (n, slots)))
            alpha = level[:, None] * factors
            accepted = accepted_tokens(rng, np.repeat(alpha.ravel(), drafts.ravel()), self.k)
            cells = np.repeat(window_of_cell, drafts.ravel())
            accepted_sum += np.bincount(cells, weights=accepted, minlength=n)
            whole_sum += np.bincount(cells, weights=(accepted == self.k), minlength=n)
            drafts_sum += drafts.sum(axis=1)
        return {
            "accepted": accepted_sum,
            "drafts": drafts_sum,
            "failures": drafts_sum - whole_sum,
            "draft_tokens": drafts_sum * self.k,
        }
