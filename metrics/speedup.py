"""Expected speedup of speculative decoding: Leviathan et al.'s formulas and vLLM's measured rates.

Leviathan, Kalman, Matias (arXiv:2211.17192) assume every draft token is accepted with the same
probability alpha once the tokens before it were. vLLM measures something else: p_i, the share of drafts
whose tokens 0..i were *all* accepted (unconditional, non-increasing). Under Leviathan's model
p_i = alpha^(i+1), but real drafts are usually better at position 0 than later, so the functions on
``per_position`` use the measured p_i themselves and assume a geometric shape only where nothing was
measured. c is the time of one draft step over one target step (see store/baseline.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# The k values the report weighs: vLLM's guidance and published tuning stay at or below 7, and past 8
# the expected speedup would rest mostly on extrapolated positions.
K_MAX = 8

# optimal_gamma's default search range: with c = 0 the speedup grows with every gamma (up to 1/(1 - alpha)),
# so some cap is needed, and no deployment drafts anywhere near 32 tokens a step.
MAX_GAMMA = 32

# How many of the last measured positions set the geometric tail: one position is noisy, and the
# conditional rates of EAGLE-style drafts settle to a roughly flat level after the first.
TAIL_POSITIONS = 3

# Speedups this close (relative) are the same number computed two ways: a tie, which goes to the
# smaller k, so that rounding never decides between k values.
TIE_TOLERANCE = 1e-9


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"an acceptance rate is between 0 and 1, not {alpha}")


def _check_tokens(count: int, name: str) -> None:
    if count < 0:
        raise ValueError(f"{name} is a number of draft tokens, >= 0, not {count}")


def _check_cost(cost: float) -> None:
    if not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"a draft's cost is a finite number >= 0, not {cost}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens one iteration yields, the target's own token included (Leviathan Eq. 1).

    (1 - alpha^(gamma+1)) / (1 - alpha); at alpha = 1 every draft token is accepted, so gamma + 1.
    """
    _check_alpha(alpha)
    _check_tokens(gamma, "gamma")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Expected speedup over plain decoding (Theorem 3.8): Eq. 1 tokens per gamma*c + 1 target steps.

    Assumes the target checks gamma + 1 positions in the time of one step, which holds while decoding is
    memory-bound (small batches).
    """
    _check_cost(c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """How many times plain decoding's arithmetic speculation spends per token (Theorem 3.11).

    (1 - alpha)(gamma*c_hat + gamma + 1) / (1 - alpha^(gamma+1)), written as
    (gamma*c_hat + gamma + 1) / Eq. 1: each iteration runs the target on gamma + 1 positions and the
    draft (c_hat of the target's operations each) on gamma, and yields Eq. 1 tokens.
    """
    _check_cost(c_hat)
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def _first_best(values: Sequence[float]) -> int:
    """Index of the highest value; a value within TIE_TOLERANCE of the best so far does not replace it."""
    best = 0
    for index, value in enumerate(values):
        if value > values[best] + TIE_TOLERANCE * abs(values[best]):
            best = index
    return best


def optimal_gamma(alpha: float, c: float, max_gamma: int = MAX_GAMMA) -> int:
    """The integer gamma in 1..max_gamma with the highest Theorem 3.8 speedup (ties: the smaller gamma).

    The paper finds it numerically (its Figure 3); so does this. At c = 0 the speedup only grows with
    gamma, and the answer is max_gamma unless the growth has fallen below rounding.
    """
    if max_gamma < 1:
        raise ValueError(f"max_gamma is at least 1, not {max_gamma}")
    speedups = [walltime_improvement(alpha, gamma, c) for gamma in range(1, max_gamma + 1)]
    return 1 + _first_best(speedups)


def conditional_rates(per_position: Sequence[float]) -> list[float]:
    """EAGLE-style conditional acceptance from vLLM's unconditional p_i: [p_0, p_1/p_0, p_2/p_1, ...].

    A position after one nobody reached (p = 0) gets rate 0: nothing was drafted there to accept.
    """
    rates: list[float] = []
    reached = 1.0
    for p in per_position:
        rates.append(p / reached if reached > 0 else 0.0)
        reached = p
    return rates


def tail_rate(per_position: Sequence[float]) -> float:
    """The conditional rate assumed past the last measured position.

    The mean conditional rate of the last TAIL_POSITIONS positions, leaving out position 0 when later
    ones were measured (the first token is usually accepted more often than the rest), capped at 1 so
    the extended p_i never rise.
    """
    if not per_position:
        raise ValueError("no measured positions to extrapolate from")
    rates = conditional_rates(per_position)
    later = rates[1:] if len(rates) > 1 else rates
    last = later[-TAIL_POSITIONS:]
    return min(1.0, sum(last) / len(last))


def extended_positions(per_position: Sequence[float], k: int) -> list[float]:
    """p_0..p_{k-1}: the measured ones, then a geometric tail at tail_rate() for positions not measured."""
    _check_tokens(k, "k")
    positions = list(per_position[:k])
    if len(positions) < k:
        rate = tail_rate(per_position)
        while len(positions) < k:
            positions.append(positions[-1] * rate)
    return positions


def speedup_at(per_position: Sequence[float], k: int, c: float) -> float:
    """Expected speedup of running with k speculative tokens: (1 + Σ_{i<k} p_i) / (1 + k·c).

    1 + Σ p_i is the mean acceptance length at k, and 1 + k·c the time of one iteration in target
    steps (Theorem 3.8 with the measured p_i in place of alpha^(i+1)). For k beyond the measured
    positions the p_i continue geometrically at tail_rate(): that part is an extrapolation, and the
    caller should show it as one. Raises ValueError when k > 0 and nothing was measured.
    """
    _check_cost(c)
    return (1 + sum(extended_positions(per_position, k))) / (1 + k * c)


class KSpeedup(NamedTuple):
    """The expected speedup at one k; ``extrapolated`` when k goes past the measured positions."""

    k: int
    speedup: float
    extrapolated: bool


@dataclass(frozen=True)
class BestK:
    """The speedup at each k = 1..k_max, the best k, and the current k's speedup when it is known."""

    table: tuple[KSpeedup, ...]
    k: int
    speedup: float
    current_k: int | None = None
    current_speedup: float | None = None

    @property
    def extrapolated(self) -> bool:
        """Whether the best k's speedup rests on positions that were not measured."""
        return self.table[self.k - 1].extrapolated

    @property
    def gain(self) -> float | None:
        """How much faster the best k is than the current one, relative (0.05: 5 % faster)."""
        if self.current_speedup is None:
            return None
        return self.speedup / self.current_speedup - 1


def best_k(
    per_position: Sequence[float], c: float, k_max: int = K_MAX, current_k: int | None = None
) -> BestK:
    """The k in 1..k_max with the highest speedup_at() (ties: the smaller k, which drafts less)."""
    if k_max < 1:
        raise ValueError(f"k_max is at least 1, not {k_max}")
    measured = len(per_position)
    table = tuple(KSpeedup(k, speedup_at(per_position, k, c), k > measured) for k in range(1, k_max + 1))
    best = table[_first_best([row.speedup for row in table])]
    return BestK(
        table=table,
        k=best.k,
        speedup=best.speedup,
        current_k=current_k,
        current_speedup=None if current_k is None else speedup_at(per_position, current_k, c),
    )
