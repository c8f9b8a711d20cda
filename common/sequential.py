"""Sequential tests on vLLM's speculative-decoding counters: the chain model's per-token acceptance,
a CUSUM that detects a drop in it, and an SPRT that decides whether it has recovered.

**The chain model.** A draft of k tokens is checked position by position and stops at the first
rejection; each position is accepted with probability α given the ones before. vLLM counts
acceptance as a prefix (position i counts the drafts whose tokens 0..i were all accepted), so over
a window, S = accepted tokens and F = drafts − drafts accepted whole (``per_pos[k-1]``): every draft
is a run of S_d successes ended by one failure, unless all k were accepted. The window's likelihood
is α^S (1−α)^F, whatever k is, and α̂ = S / (S + F). vLLM's own acceptance rate, accepted / draft
tokens = α(1−α^k) / (k(1−α)), reads 0.70, 0.51 and 0.39 at k = 1, 3 and 5 for the same α = 0.7.

**Overdispersion.** Requests differ (prompts, temperatures), so the tokens of a window are far from
independent trials: its α̂ varies φ times more than a binomial's (Pearson's χ²/df over in-control
windows). And requests outlive a window, so consecutive windows are correlated: over many
windows the evidence varies more still (``Dispersion.long_run``). Every log-likelihood ratio is
divided by that long-run dispersion.

**CUSUM** (Page 1954) for a drop α₀ → α₁: Z = [S ln(α₁/α₀) + F ln((1−α₁)/(1−α₀))] / φ per window,
G = max(0, G + Z), alarm at G ≥ h. With h = ln(T), Lorden's bound gives an in-control average run
length of at least T windows (one false alarm per T windows at most, on average).

**SPRT** (Wald) to verify a remedy: Λ = ΣZ until Λ ≥ ln((1−β)/a) (still collapsed) or
Λ ≤ ln(β/(1−a)) (recovered), with a = P(called collapsed | recovered), β = P(called recovered |
still collapsed). Its rounds are a few requests sent at once, each its own draw of the traffic's
variety, so a round's tokens are overdispersed too, but only by what differs between requests
(``round_dispersion``): nothing carries over from one round to the next, and the CUSUM's long-run
φ, which counts requests spread over many windows, is tens of times too large for a round.

Pure arithmetic, no dependencies: the daemon's detector and the actions' checks share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# α̂ at 0 or 1 makes the log-likelihood ratio infinite: the in-control and shifted values are kept
# this far inside (0, 1).
EDGE = 1e-3
# Siegmund's correction of the threshold for the overshoot of a normal random walk.
SIEGMUND_OVERSHOOT = 1.166


def chain_trials(accepted: float, drafts: float, full: float) -> tuple[float, float]:
    """(S, F): accepted tokens, and drafts that ended in a rejection (``full``: drafts whose k
    tokens were all accepted, vLLM's per_pos[k-1])."""
    return accepted, max(0.0, drafts - full)


def alpha_hat(successes: float, failures: float) -> float | None:
    """The chain model's maximum-likelihood α: S / (S + F); None without trials."""
    trials = successes + failures
    return successes / trials if trials > 0 else None


def vllm_rate(alpha: float, k: int) -> float:
    """vLLM's acceptance rate (accepted / draft tokens) for per-token acceptance α at k draft tokens."""
    if alpha >= 1.0:
        return 1.0
    return alpha * (1 - alpha**k) / (k * (1 - alpha))


def alpha_for_rate(rate: float, k: int) -> float:
    """The per-token α whose vLLM acceptance rate at k is ``rate`` (the inverse of ``vllm_rate``,
    which rises with α): bisection to 1e-12."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"an acceptance rate is in [0, 1], got {rate!r}")
    low, high = 0.0, 1.0
    while high - low > 1e-12:
        middle = (low + high) / 2
        if vllm_rate(middle, k) < rate:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def inside(alpha: float) -> float:
    return min(1.0 - EDGE, max(EDGE, alpha))


def llr(successes: float, failures: float, alpha0: float, alpha1: float) -> float:
    """ln of the likelihood of α₁ over α₀ for a window of S successes and F failures."""
    a0, a1 = inside(alpha0), inside(alpha1)
    return successes * math.log(a1 / a0) + failures * math.log((1 - a1) / (1 - a0))


def kl(a: float, b: float) -> float:
    """The Kullback-Leibler divergence KL(a || b) of two Bernoulli laws, in nats."""
    a, b = inside(a), inside(b)
    return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))


def window_evidence(successes: float, trials: float, alpha0: float, phi: float) -> float:
    """What one window says by itself against α₀ when its α̂ is below it: the generalised likelihood
    ratio, (N / φ) KL(α̂ || α₀) in nats (0 when α̂ is not below α₀). For N / φ independent trials at
    α₀ it reaches e with probability at most exp(−e) (Chernoff), so a threshold of ln(T) is crossed
    by an in-control window at most once in T on average, whatever the windows' correlation."""
    if trials <= 0:
        return 0.0
    alpha = successes / trials
    if alpha >= alpha0:
        return 0.0
    return trials / max(1.0, phi) * kl(alpha, alpha0)


def threshold(windows: float) -> float:
    """h = ln(T): by Lorden's bound, at most one false alarm per T windows on average."""
    if windows <= 1:
        raise ValueError("the false-alarm target must span more than one window")
    return math.log(windows)


def siegmund_arl(drift: float, reference: float, h: float) -> float:
    """Siegmund's approximation of the average run length of a CUSUM on unit-variance normal
    increments with mean ``drift``, reference value ``reference`` and threshold ``h``."""
    delta = drift - reference
    b = h + SIEGMUND_OVERSHOOT
    if abs(delta) < 1e-9:
        return b * b
    return (math.exp(-2 * delta * b) + 2 * delta * b - 1) / (2 * delta * delta)


def llr_arl0(trials: float, alpha0: float, alpha1: float, phi: float, h: float) -> float:
    """The in-control run length Siegmund's approximation predicts for this module's CUSUM with
    ``trials`` per window and dispersion ``phi``: the window's Z, standardised, is a normal walk."""
    a0, a1 = inside(alpha0), inside(alpha1)
    per_success, per_failure = math.log(a1 / a0), math.log((1 - a1) / (1 - a0))
    mean = trials * (a0 * per_success + (1 - a0) * per_failure) / phi
    # Var(S) = φ N α(1−α) and F = N − S: Z = (S (ln a − ln b) + N ln b) / φ.
    sd = math.sqrt(phi * trials * a0 * (1 - a0)) * abs(per_success - per_failure) / phi
    return siegmund_arl(mean / sd, 0.0, h / sd)


LAGS = (1, 2)  # the autocorrelations the long-run dispersion is read from
_LAG_NAMES = tuple((lag, str(lag)) for lag in LAGS)  # as the JSON keys them
_KEPT = max(LAGS)  # the windows ``recent`` keeps


@dataclass
class Dispersion:
    """Sufficient statistics of in-control windows for α̂, Pearson's φ = χ² / (W − 1) and the
    autocorrelation of the windows' Pearson residuals at lags 1 and 2.

    Requests outlive a window, so consecutive windows share requests and their residuals are
    correlated: a sum over many windows varies more than φ alone says, and a CUSUM adds windows
    up. A request that goes on to the next window with probability r makes ρ_j = ρ_1 r^(j−1), so
    the long-run factor is 1 + 2 Σ ρ_j = 1 + 2 ρ_1 / (1 − r), with r = ρ_2 / ρ_1; ``phi`` is
    φ times that, ``window_phi`` the windows' own. The residual of window w is
    r_w = (S_w − α N_w) / sqrt(N_w α (1 − α)); the sums below are the expansions of Σ r_w² and
    Σ r_w r_(w−j) in powers of α, so that α̂ need not be known while the windows come.
    """

    windows: int = 0
    successes: float = 0.0
    trials: float = 0.0
    square: float = 0.0  # Σ S_w² / N_w
    # Per lag j: [pairs, Σ S S' / √(N N'), Σ (S N' + N S') / √(N N'), Σ √(N N')], ' = window w − j
    cross: dict[str, list[float]] = field(default_factory=dict)
    recent: list[list[float]] = field(default_factory=list)  # the last windows' (S, N), newest last

    def add(self, successes: float, trials: float, follows: bool = True) -> None:
        """One window; ``follows``: it comes right after the last one added (no gap between)."""
        self.extend(((successes, trials, follows),))

    def extend(self, windows: Iterable[tuple[float, float, bool]]) -> None:
        """``add`` of each ``(successes, trials, follows)`` in turn, in one loop over local sums: the
        warm-up's check builds one over an hour of windows, for every series."""
        count, successes, trials, square = self.windows, self.successes, self.trials, self.square
        sums = [(lag, name, self.cross.get(name)) for lag, name in _LAG_NAMES]
        recent = self.recent  # this Dispersion's own (from_json copies what it reads)
        for s, n, follows in windows:
            if n <= 0:
                continue
            count += 1
            successes += s
            trials += n
            square += s * s / n
            if not follows:
                recent = []
            for i, (lag, name, lag_sums) in enumerate(sums):
                if len(recent) >= lag:
                    if lag_sums is None:
                        lag_sums = self.cross[name] = [0.0, 0.0, 0.0, 0.0]
                        sums[i] = (lag, name, lag_sums)
                    s0, n0 = recent[-lag]
                    root = math.sqrt(n * n0)
                    lag_sums[0] += 1
                    lag_sums[1] += s * s0 / root
                    lag_sums[2] += (s * n0 + n * s0) / root
                    lag_sums[3] += root
            recent.append([s, n])
            if len(recent) > _KEPT:
                del recent[0]
        self.windows, self.successes, self.trials, self.square, self.recent = (
            count,
            successes,
            trials,
            square,
            recent,
        )

    @property
    def alpha(self) -> float | None:
        return self.successes / self.trials if self.trials > 0 else None

    def _spread(self) -> float | None:
        """Σ r_w² at α̂ (the χ² statistic); None when it cannot be told."""
        alpha = self.alpha
        if alpha is None or not 0 < alpha < 1:
            return None
        return max(0.0, self.square - alpha * self.successes) / (alpha * (1 - alpha))

    @property
    def window_phi(self) -> float | None:
        """χ² / df, at least 1 (fewer than 2 windows: unknown). Σ (S_w − α̂ N_w)² / N_w expands to
        Σ S_w²/N_w − α̂ Σ S_w, since α̂ Σ N_w = Σ S_w."""
        if self.windows < 2 or self.alpha is None:
            return None
        chi2 = self._spread()
        if chi2 is None:  # every token accepted (or none): no spread to measure, none assumed
            return 1.0
        return max(1.0, chi2 / (self.windows - 1))

    def autocorrelation(self, lag: int) -> float:
        """ρ at ``lag``, in [0, 0.95] (0 when it cannot be told)."""
        sums = self.cross.get(str(lag))
        chi2 = self._spread()
        alpha = self.alpha
        if sums is None or sums[0] < 2 or not chi2 or alpha is None:
            return 0.0
        cross = (sums[1] - alpha * sums[2] + alpha * alpha * sums[3]) / (alpha * (1 - alpha)) / sums[0]
        return min(0.95, max(0.0, cross / (chi2 / self.windows)))

    @property
    def long_run(self) -> float:
        """1 + 2 ρ_1 / (1 − r), r = ρ_2 / ρ_1 (the share of a window's requests still there next)."""
        rho1 = self.autocorrelation(1)
        if rho1 <= 0:
            return 1.0
        r = min(0.95, self.autocorrelation(2) / rho1)
        return 1 + 2 * rho1 / (1 - r)

    @property
    def phi(self) -> float | None:
        """The long-run dispersion the CUSUM divides by: φ times the autocorrelation's factor."""
        phi = self.window_phi
        return None if phi is None else phi * self.long_run

    @classmethod
    def of(cls, windows: Iterable[tuple[float, float, bool]]) -> Dispersion:
        """The sums of ``windows`` (``extend``) from none."""
        made = cls()
        made.extend(windows)
        return made

    def to_json(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "successes": self.successes,
            "trials": self.trials,
            "square": self.square,
            "cross": {name: list(values) for name, values in self.cross.items()},
            "recent": [list(pair) for pair in self.recent],
        }

    @classmethod
    def from_json(cls, raw: Any) -> Dispersion:
        if not isinstance(raw, dict):
            return cls()

        def number(key: str) -> float:
            value = raw.get(key)
            return float(value) if isinstance(value, int | float) else 0.0

        given_cross, given_recent = raw.get("cross"), raw.get("recent")
        cross: dict[Any, Any] = given_cross if isinstance(given_cross, dict) else {}
        recent: list[Any] = given_recent if isinstance(given_recent, list) else []
        return cls(
            windows=int(number("windows")),
            successes=number("successes"),
            trials=number("trials"),
            square=number("square"),
            cross={
                str(k): [float(x) for x in v] for k, v in cross.items() if isinstance(v, list) and len(v) == 4
            },
            recent=[[float(x) for x in pair] for pair in recent if isinstance(pair, list) and len(pair) == 2],
        )


def cusum_step(g: float, z: float, cap: float) -> float:
    """G after one window: max(0, G + Z), held at ``cap``: once it alarms, G cannot climb without
    bound, so that falling back below h takes about as much in-control evidence as it took
    out-of-control evidence to alarm."""
    return min(cap, max(0.0, g + z))


class Decision(StrEnum):
    RECOVERED = "recovered"
    COLLAPSED = "collapsed"
    UNDECIDED = "undecided"


def round_dispersion(trials_per_request: float, spread: float, alpha: float) -> float:
    """Pearson's dispersion of the tokens of independent requests of n trials each, whose own
    per-token acceptances vary around α with standard deviation s = ``spread``: given its α_i a
    request's S is binomial, so Var(S) = n E[α_i(1 − α_i)] + n² s² = n α(1 − α) + n(n − 1) s², and
    φ = 1 + (n − 1) s² / (α(1 − α)), however many requests the round holds."""
    if not 0 < alpha < 1:
        raise ValueError(f"a per-token acceptance is in (0, 1), got {alpha!r}")
    if spread < 0 or spread * spread >= alpha * (1 - alpha):
        raise ValueError(
            f"spread {spread:g} is not a standard deviation of acceptances around {alpha:g}: it must "
            f"be at least 0 and below sqrt(alpha (1 - alpha)) = {math.sqrt(alpha * (1 - alpha)):.3f}"
        )
    return 1 + max(0.0, trials_per_request - 1) * spread * spread / (alpha * (1 - alpha))


@dataclass(frozen=True)
class Sprt:
    """Wald's sequential probability ratio test of α₀ (recovered) against α₁ (still collapsed)."""

    alpha0: float
    alpha1: float
    phi: float = 1.0
    false_recovery: float = 0.01  # P(called recovered | still collapsed)
    false_collapse: float = 0.05  # P(called collapsed | recovered)

    def __post_init__(self) -> None:
        if not 0 < self.alpha1 < self.alpha0 < 1:
            raise ValueError(f"need 0 < shift_to ({self.alpha1}) < in_control ({self.alpha0}) < 1")
        for name in ("false_recovery", "false_collapse"):
            if not 0 < getattr(self, name) < 0.5:
                raise ValueError(f"{name} is an error rate in (0, 0.5)")
        if self.phi < 1:
            raise ValueError("phi is at least 1")

    @property
    def upper(self) -> float:
        """Λ at or above this: still collapsed."""
        return math.log((1 - self.false_recovery) / self.false_collapse)

    @property
    def lower(self) -> float:
        """Λ at or below this: recovered."""
        return math.log(self.false_recovery / (1 - self.false_collapse))

    def evidence(self, successes: float, failures: float) -> float:
        return llr(successes, failures, self.alpha0, self.alpha1) / self.phi

    def decide(self, total: float) -> Decision:
        if total >= self.upper:
            return Decision.COLLAPSED
        if total <= self.lower:
            return Decision.RECOVERED
        return Decision.UNDECIDED
