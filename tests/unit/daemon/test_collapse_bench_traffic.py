"""The collapse detector's benchmark draws its traffic with numpy, many drafts at a time, instead of
running the simulator: these pin it to the simulator's model (sim/model.py), so that the two
cannot drift apart."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from benchmarks.collapse_traffic import (
    IN_CONTROL,
    MEAN_LIFE,
    SPREAD,
    Traffic,
    accepted_tokens,
    request_factors,
)
from specguard.sim.model import acceptance_at, request_factor, sample_accepted

DRAWS = 40000


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("alpha", [0.3, 0.45, 0.75, 0.95])
def test_a_drafts_accepted_tokens_follow_the_simulators_law(alpha: float, k: int) -> None:
    # The chain: P(j accepted) = alpha^j (1 - alpha) for j < k, alpha^k for all k.
    exact = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    rng = random.Random(k)
    conditional = acceptance_at([alpha], k, 0.0, 0.0)
    simulator = np.bincount([sample_accepted(rng, conditional) for _ in range(DRAWS)], minlength=k + 1)
    bench = np.bincount(accepted_tokens(np.random.default_rng(k), np.full(DRAWS, alpha), k), minlength=k + 1)
    margin = 5 * np.sqrt(exact * (1 - exact) / DRAWS) + 1e-9
    assert np.all(np.abs(simulator / DRAWS - exact) < margin), simulator / DRAWS
    assert np.all(np.abs(bench / DRAWS - exact) < margin), bench / DRAWS


def test_a_requests_own_acceptance_follows_the_simulators_law() -> None:
    rng = random.Random(3)
    simulator = np.array([request_factor(rng, IN_CONTROL, SPREAD) for _ in range(DRAWS)])
    bench = request_factors(np.random.default_rng(3), DRAWS)
    for factors in (simulator, bench):
        levels = IN_CONTROL * factors  # what a request's acceptance is at the configured level
        assert levels.mean() == pytest.approx(IN_CONTROL, abs=5 * SPREAD / math.sqrt(DRAWS))
        assert levels.std() == pytest.approx(SPREAD, rel=0.03)
        assert levels.max() < 1.0  # a Beta: the simulator's cap at 1 never bites at this level
    quantiles = [0.01, 0.1, 0.5, 0.9, 0.99]
    assert np.quantile(bench, quantiles) == pytest.approx(np.quantile(simulator, quantiles), abs=0.01)


@pytest.mark.parametrize("heavy", [False, True], ids=["geometric", "lognormal"])
def test_requests_last_thirty_seconds_on_average_and_the_heavy_tail_is_heavy(heavy: bool) -> None:
    traffic = Traffic(np.random.default_rng(5), 3, 64, heavy=heavy)
    starts = traffic.starts(20000)
    lives = []
    for slot in range(starts.shape[1]):
        begun = np.flatnonzero(starts[:, slot])
        lives += list(np.diff(begun))
    seconds = np.array(lives) * 5.0
    assert seconds.mean() == pytest.approx(MEAN_LIFE, rel=0.08)
    # Geometric: 1 in e^10 over 5 minutes. Lognormal (sd of log 1.5): about 1 in 100, the median
    # a third of the mean.
    over_five_minutes = float(np.mean(seconds > 300))
    if heavy:
        assert 0.005 < over_five_minutes < 0.02 and np.median(seconds) <= MEAN_LIFE / 2
    else:
        assert over_five_minutes < 0.001 and np.median(seconds) >= MEAN_LIFE / 2


def test_a_window_holds_the_chain_models_counts() -> None:
    # 16 requests at 0.75 and k = 5: alpha-hat = S / (S + F) recovers the requests' pooled level,
    # and a window cut in two by a drop holds both levels' drafts.
    traffic = Traffic(np.random.default_rng(8), 5, 16)
    counts = traffic.windows(np.full(2000, 0.75))
    alpha = counts["accepted"].sum() / (counts["accepted"] + counts["failures"]).sum()
    assert alpha == pytest.approx(0.768, abs=0.01)  # heterogeneous requests: above 0.75 at k = 5
    assert counts["drafts"].mean() == pytest.approx(16 * 50, rel=0.02)
    cut = traffic.windows(np.full(2000, 0.75), np.full(2000, 0.5), np.full(2000, 0.45))
    half = cut["accepted"].sum() / (cut["accepted"] + cut["failures"]).sum()
    assert 0.5 < half < 0.7
