"""The chain model's per-token acceptance, the CUSUM's threshold and the SPRT (common/sequential.py).

Drafts are generated as vLLM counts them: positions tried in order, each accepted with probability
α given the ones before, the draft stopping at the first rejection; vLLM adds 1 to positions
0..accepted-1 (prefix counting).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from specguard.common.sequential import (
    Decision,
    Dispersion,
    Sprt,
    alpha_for_rate,
    alpha_hat,
    chain_trials,
    cusum_step,
    kl,
    llr,
    llr_arl0,
    round_dispersion,
    siegmund_arl,
    threshold,
    vllm_rate,
    window_evidence,
)


def vllm_counters(rng: random.Random, alpha: float, k: int, drafts: int) -> dict[str, float]:
    """What vLLM's counters add up over ``drafts`` drafts of k tokens at per-token acceptance α."""
    accepted, per_pos = 0, [0] * k
    for _ in range(drafts):
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        accepted += a
        for position in range(a):
            per_pos[position] += 1
    return {"accepted": accepted, "drafts": drafts, "draft_tokens": drafts * k, "full": per_pos[k - 1]}


@pytest.mark.parametrize("k", range(1, 9))
def test_alpha_hat_recovers_the_chain_alpha_at_every_k(k: int) -> None:
    rng = random.Random(k)
    for alpha in (0.3, 0.6, 0.75, 0.9):
        counters = vllm_counters(rng, alpha, k, 20000)
        s, f = chain_trials(counters["accepted"], counters["drafts"], counters["full"])
        estimate = alpha_hat(s, f)
        assert estimate is not None
        # Binomial standard error of S / (S + F) over those trials, four of them as the margin.
        se = math.sqrt(alpha * (1 - alpha) / (s + f))
        assert abs(estimate - alpha) < 4 * se, (k, alpha, estimate)


def test_the_same_alpha_at_different_k_gives_the_same_estimate_but_vllms_rate_falls() -> None:
    rng = random.Random(7)
    estimates, rates = [], []
    for k in (1, 3, 5, 8):
        counters = vllm_counters(rng, 0.7, k, 40000)
        s, f = chain_trials(counters["accepted"], counters["drafts"], counters["full"])
        estimates.append(alpha_hat(s, f))
        rates.append(counters["accepted"] / counters["draft_tokens"])
    assert max(estimates) - min(estimates) < 0.01  # type: ignore[operator]
    assert rates == sorted(rates, reverse=True) and rates[0] - rates[-1] > 0.35
    # vLLM's rate is α(1−α^k)/(k(1−α)): 0.70, 0.51, 0.39 at k = 1, 3, 5 (the figures).
    assert [round(vllm_rate(0.7, k), 2) for k in (1, 3, 5)] == [0.70, 0.51, 0.39]
    for k, rate in zip((1, 3, 5, 8), rates, strict=True):
        assert rate == pytest.approx(vllm_rate(0.7, k), abs=0.01)


@pytest.mark.parametrize("k", range(1, 9))
def test_alpha_for_rate_inverts_vllms_rate(k: int) -> None:
    for rate in (0.05, 0.3, 0.4, 0.5, 0.9):
        alpha = alpha_for_rate(rate, k)
        assert vllm_rate(alpha, k) == pytest.approx(rate, abs=1e-9)
    assert alpha_for_rate(0.4, 1) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        alpha_for_rate(1.5, k)


def test_the_window_likelihood_ratio_is_the_chain_models() -> None:
    # S successes and F failures: ln[(α1^S (1−α1)^F) / (α0^S (1−α0)^F)].
    s, f = 30.0, 12.0
    expected = math.log((0.45**s * 0.55**f) / (0.75**s * 0.25**f))
    assert llr(s, f, 0.75, 0.45) == pytest.approx(expected)
    assert llr(10, 0, 1.0, 0.5) < 0 and math.isfinite(llr(0, 10, 1.0, 0.5))  # α0 = 1 kept finite


def test_siegmund_reproduces_the_references_figure_and_a_monte_carlo_arl() -> None:
    # k = 0.5, h = 5, in control: Siegmund ≈ 938 (the reference's cross-check; a Monte-Carlo run
    # gave ≈ 932). Here 4,000 normal CUSUM runs, vectorised.
    assert siegmund_arl(0.0, 0.5, 5.0) == pytest.approx(938, abs=1)
    rng = np.random.default_rng(1)
    runs = 4000
    g = np.zeros(runs)
    length = np.zeros(runs)
    alive = np.ones(runs, dtype=bool)
    step = 0
    while alive.any():
        step += 1
        g[alive] = np.maximum(0.0, g[alive] + rng.standard_normal(alive.sum()) - 0.5)
        done = alive & (g >= 5.0)
        length[done] = step
        alive &= ~done
    assert length.mean() == pytest.approx(938, rel=0.06)


def _bernoulli_cusum_arl0(
    rng: np.random.Generator, trials: int, alpha0: float, alpha1: float, h: float, runs: int
) -> float:
    """Mean windows to a false alarm of the module's CUSUM, binomial in-control windows."""
    g = np.zeros(runs)
    length = np.zeros(runs)
    alive = np.ones(runs, dtype=bool)
    per_success, per_failure = math.log(alpha1 / alpha0), math.log((1 - alpha1) / (1 - alpha0))
    step = 0
    while alive.any() and step < 200_000:
        step += 1
        s = rng.binomial(trials, alpha0, alive.sum())
        z = s * per_success + (trials - s) * per_failure
        g[alive] = np.minimum(2 * h, np.maximum(0.0, g[alive] + z))
        done = alive & (g >= h)
        length[done] = step
        alive &= ~done
    length[alive] = step
    return float(length.mean())


def test_h_of_ln_t_keeps_false_alarms_rarer_than_one_per_t_windows() -> None:
    # Lorden: ARL0 >= e^h. At T = 500 windows of 50 trials, h = ln 500, 400 runs each; for the
    # large shift the bound is far from tight (the walk drifts down fast), for a small one
    # Siegmund's approximation of the standardised walk predicts the measured length.
    target = 500
    h = threshold(target)
    large = _bernoulli_cusum_arl0(np.random.default_rng(5), 50, 0.75, 0.45, h, 400)
    assert large >= target
    small = _bernoulli_cusum_arl0(np.random.default_rng(6), 50, 0.75, 0.70, h, 400)
    assert small >= target
    assert small == pytest.approx(llr_arl0(50, 0.75, 0.70, 1.0, h), rel=0.3)


def test_a_threshold_needs_more_than_one_window() -> None:
    assert threshold(30 * 86400 / 10) == pytest.approx(12.47, abs=0.01)  # the reference's figure
    with pytest.raises(ValueError):
        threshold(1)


def test_pearson_dispersion_is_one_for_binomial_windows_and_large_for_heterogeneous_ones() -> None:
    rng = np.random.default_rng(3)
    binomial = Dispersion()
    for s in rng.binomial(400, 0.7, 300):
        binomial.add(float(s), 400.0)
    assert binomial.phi == pytest.approx(1.0, abs=0.25)
    assert binomial.alpha == pytest.approx(0.7, abs=0.01)
    mixed = Dispersion()
    for _ in range(300):  # 8 requests a window, each with its own α ~ Beta(mean 0.7, sd 0.1)
        alphas = rng.beta(14.0, 6.0, 8)
        s = rng.binomial(50, alphas).sum()
        mixed.add(float(s), 400.0)
    # Var of one request's S: 50 E[α(1−α)] + 50² Var(α) = 50 * 0.20 + 2500 * 0.01 = 35; a window
    # of 8: 280, against 400 * 0.7 * 0.3 = 84 for as many independent tokens: φ = 280 / 84 = 3.33.
    assert mixed.phi == pytest.approx(280 / 84, rel=0.2)
    restored = Dispersion.from_json(mixed.to_json())
    assert restored == mixed
    assert Dispersion().phi is None and Dispersion.from_json("junk") == Dispersion()


def test_every_token_accepted_gives_no_dispersion_rather_than_a_division_by_zero() -> None:
    d = Dispersion()
    for _ in range(5):
        d.add(100.0, 100.0)
    assert d.alpha == 1.0 and d.phi == 1.0


def test_the_cusum_never_goes_below_zero_and_is_held_at_its_cap() -> None:
    assert cusum_step(0.0, -3.0, 20.0) == 0.0
    assert cusum_step(5.0, 2.0, 20.0) == 7.0
    assert cusum_step(19.0, 5.0, 20.0) == 20.0


def test_the_sprt_stops_on_the_right_side_with_its_stated_error_rates() -> None:
    sprt = Sprt(alpha0=0.75, alpha1=0.45, phi=1.0, false_recovery=0.01, false_collapse=0.05)
    assert sprt.upper == pytest.approx(math.log(0.99 / 0.05))
    assert sprt.lower == pytest.approx(math.log(0.01 / 0.95))
    rng = np.random.default_rng(11)

    def decide(alpha: float) -> Decision:
        total = 0.0
        while True:
            s = float(rng.binomial(10, alpha))
            total += sprt.evidence(s, 10 - s)
            decision = sprt.decide(total)
            if decision is not Decision.UNDECIDED:
                return decision

    recovered = [decide(0.75) for _ in range(2000)]
    collapsed = [decide(0.45) for _ in range(2000)]
    # Wald's bounds: the error rates come out at or below the stated ones (with sampling slack).
    assert recovered.count(Decision.COLLAPSED) / 2000 <= 0.05 + 0.015
    assert collapsed.count(Decision.RECOVERED) / 2000 <= 0.01 + 0.007


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha0": 0.4, "alpha1": 0.6}, "shift_to"),
        ({"alpha0": 0.75, "alpha1": 0.45, "false_recovery": 0.7}, "false_recovery"),
        ({"alpha0": 0.75, "alpha1": 0.45, "phi": 0.5}, "phi"),
    ],
)
def test_an_sprt_that_cannot_decide_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sprt(**kwargs)


def test_the_docs_table_of_playbook_thresholds_is_alpha_for_rate() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "signals.md").read_text()
    for rate in (0.5, 0.4, 0.3):
        row = f"| {rate} | " + " | ".join(f"{alpha_for_rate(rate, k):.2f}" for k in range(1, 9)) + " |"
        assert row in page, row


def test_windows_that_share_requests_get_the_long_run_dispersion_of_their_sums() -> None:
    # 16 requests, each going on to the next window with probability 2/3: consecutive windows
    # share most of their requests. What a CUSUM adds up is sums of many windows, whose spread is
    # that of blocks of windows (batch means, 60 at a time), well above a single window's.
    rng = np.random.default_rng(9)
    windows, slots, per_window = 9000, 16, 50
    factors = rng.beta(14.0, 6.0, slots)
    successes, trials = [], []
    for _ in range(windows):
        renew = rng.random(slots) < 1 / 3
        factors = np.where(renew, rng.beta(14.0, 6.0, slots), factors)
        s = rng.binomial(per_window, factors)
        successes.append(float(s.sum()))
        trials.append(float(slots * per_window))
    d = Dispersion()
    for s, n in zip(successes, trials, strict=True):
        d.add(s, n)
    block = Dispersion()
    for i in range(0, windows, 60):
        block.add(sum(successes[i : i + 60]), sum(trials[i : i + 60]))
    assert d.window_phi is not None and d.phi is not None and block.window_phi is not None
    assert d.autocorrelation(1) == pytest.approx(2 / 3 * (1 - 1 / d.window_phi), abs=0.05)
    assert d.phi == pytest.approx(block.window_phi, rel=0.25)
    assert d.phi > 3 * d.window_phi
    restored = Dispersion.from_json(d.to_json())
    assert restored.phi == pytest.approx(d.phi)
    # A gap breaks the chain of neighbours: the next window is not paired with the last one.
    before = d.cross["1"][0]
    d.add(700.0, 800.0, follows=False)
    assert d.cross["1"][0] == before


def test_windows_added_one_by_one_or_all_at_once_give_the_same_sums_to_the_last_bit() -> None:
    """``of`` and ``extend`` (the warm-up's check, an hour of windows at a time) are ``add`` over each
    window in turn: the same sums in the same order, gaps and empty windows included."""
    rng = random.Random(11)
    for _ in range(200):
        windows = [
            (float(rng.randint(0, 90)), float(rng.choice([0, 90, 100, 120])), rng.random() > 0.1)
            for _ in range(rng.randint(0, 40))
        ]
        one_by_one = Dispersion()
        for s, n, follows in windows:
            one_by_one.add(s, n, follows)
        cut = rng.randint(0, len(windows))
        split = Dispersion.of(windows[:cut])
        split.extend(windows[cut:])
        for other in (Dispersion.of(windows), split):
            assert other == one_by_one and other.to_json() == one_by_one.to_json()


def test_a_round_of_requests_that_differ_varies_as_round_dispersion_says() -> None:
    # Rounds of 4 requests of 64 trials, each request's α a Beta of mean 0.75 and spread 0.1.
    from specguard.sim.model import beta_parameters

    rng = np.random.default_rng(21)
    a, b = beta_parameters(0.75, 0.1)
    d = Dispersion()
    for _ in range(4000):
        d.add(float(rng.binomial(64, rng.beta(a, b, 4)).sum()), 4 * 64.0)
    expected = round_dispersion(64, 0.1, 0.75)
    assert expected == pytest.approx(1 + 63 * 0.01 / 0.1875)
    assert d.window_phi == pytest.approx(expected, rel=0.1)
    assert round_dispersion(64, 0.0, 0.75) == 1.0  # requests alike: binomial
    assert round_dispersion(1, 0.1, 0.75) == 1.0  # one trial each: nothing shared


def test_a_spread_no_beta_distribution_has_is_refused() -> None:
    with pytest.raises(ValueError, match=r"around 0.99: .* below sqrt\(alpha \(1 - alpha\)\) = 0.099"):
        round_dispersion(64, 0.15, 0.99)


def test_with_requests_that_differ_the_pooled_alpha_hat_rises_a_little_with_k() -> None:
    # The same at every k holds for drafts alike. With each request's α a Beta of mean 0.75 and
    # spread 0.1, a request that accepts more makes more trials per draft, and the more so at a
    # larger k: pooled, α̂ reads 0.750, 0.761, 0.768 and 0.776 at k = 1, 3, 5 and 8.
    from specguard.sim.model import beta_parameters

    rng = np.random.default_rng(13)
    a, b = beta_parameters(0.75, 0.1)
    alphas = rng.beta(a, b, 100_000)[:, None]
    pooled = {}
    for k in (1, 3, 5, 8):
        accepted = np.minimum(rng.geometric(1 - alphas, (100_000, 20)) - 1, k)
        s, f = chain_trials(float(accepted.sum()), float(accepted.size), float((accepted == k).sum()))
        pooled[k] = alpha_hat(s, f)
    assert pooled == {
        1: pytest.approx(0.750, abs=0.002),
        3: pytest.approx(0.761, abs=0.002),
        5: pytest.approx(0.768, abs=0.002),
        8: pytest.approx(0.776, abs=0.002),
    }


def test_kl_of_bernoulli_laws() -> None:
    assert kl(0.75, 0.75) == 0.0
    assert kl(0.45, 0.75) == pytest.approx(0.45 * math.log(0.45 / 0.75) + 0.55 * math.log(0.55 / 0.25))
    assert kl(0.5, 0.75) > kl(0.6, 0.75) > 0


def test_a_windows_own_evidence_is_chernoffs_bound_in_nats() -> None:
    """In-control windows of N independent trials: the share whose evidence reaches e is at most
    exp(-e); a window at or above alpha0 has none; phi divides the trials."""
    n, alpha0, windows = 200, 0.75, 20_000
    successes = np.random.default_rng(3).binomial(n, alpha0, windows)
    evidence = [window_evidence(float(s), n, alpha0, 1.0) for s in successes]
    for e in (1.0, 2.0, 4.0):
        assert sum(v >= e for v in evidence) / windows <= math.exp(-e)
    assert window_evidence(160, 200, 0.75, 1.0) == 0.0
    assert window_evidence(90, 200, 0.75, 4.0) == pytest.approx(50 * kl(0.45, 0.75))
