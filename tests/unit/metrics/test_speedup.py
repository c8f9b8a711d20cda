"""The speedup arithmetic behind the report's k recommendation: Leviathan et al.'s formulas, and the
same numbers from vLLM's measured per-position acceptance."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specguard.metrics.speedup import (
    BestK,
    best_k,
    conditional_rates,
    expected_tokens,
    extended_positions,
    operations_factor,
    optimal_gamma,
    speedup_at,
    tail_rate,
    walltime_improvement,
)

# Leviathan et al., Table 1 (c = ĉ = 0): alpha, gamma, operations, speed.
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


def geometric(alpha: float, positions: int) -> list[float]:
    """vLLM's p_i under Leviathan's i.i.d. model: alpha^(i+1)."""
    return [alpha ** (i + 1) for i in range(positions)]


@pytest.mark.parametrize(("alpha", "gamma", "operations", "speed"), TABLE_1)
def test_table_1_of_the_paper_is_reproduced_to_two_decimals(
    alpha: float, gamma: int, operations: float, speed: float
) -> None:
    assert round(operations_factor(alpha, gamma, 0.0), 2) == operations
    assert round(walltime_improvement(alpha, gamma, 0.0), 2) == speed
    assert round(expected_tokens(alpha, gamma), 2) == speed  # at c = 0, Theorem 3.8 is Eq. 1


def test_the_draft_cost_divides_the_tokens_per_iteration() -> None:
    # alpha = 0.8, gamma = 4: Eq. 1 = 1 + .8 + .64 + .512 + .4096 = 3.3616; time 1 + 4 * 0.05 = 1.2.
    assert walltime_improvement(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert operations_factor(0.8, 4, 0.1) == pytest.approx((0.4 + 5) / 3.3616)


def test_a_draft_that_is_always_accepted_yields_every_token() -> None:
    assert expected_tokens(1.0, 4) == 5
    assert walltime_improvement(1.0, 4, 0.25) == 2.5
    assert operations_factor(1.0, 4, 0.0) == 1.0  # no rejected work at all
    assert speedup_at([1.0, 1.0], 4, 0.25) == 2.5  # the tail keeps the measured rate 1


def test_a_draft_that_is_never_accepted_yields_the_targets_token_only() -> None:
    assert expected_tokens(0.0, 5) == 1
    assert walltime_improvement(0.0, 5, 0.1) == pytest.approx(1 / 1.5)


@pytest.mark.parametrize("alpha", [-0.1, 1.1])
def test_an_acceptance_rate_outside_0_1_is_refused(alpha: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        expected_tokens(alpha, 3)


def test_a_negative_draft_cost_is_refused() -> None:
    with pytest.raises(ValueError, match="cost"):
        walltime_improvement(0.7, 3, -0.01)
    with pytest.raises(ValueError, match="cost"):
        speedup_at([0.7], 1, float("nan"))


def test_optimal_gamma_grows_with_acceptance_and_shrinks_with_draft_cost() -> None:
    assert optimal_gamma(0.9, 0.02) > optimal_gamma(0.6, 0.02)
    assert optimal_gamma(0.8, 0.01) > optimal_gamma(0.8, 0.2)
    # Corollary 3.9: with alpha ≤ c no gamma beats plain decoding, and gamma = 1 loses least.
    assert optimal_gamma(0.3, 0.5) == 1
    assert walltime_improvement(0.3, 1, 0.5) < 1


def test_optimal_gamma_at_zero_cost_runs_to_the_cap() -> None:
    assert optimal_gamma(0.9, 0.0, max_gamma=12) == 12
    assert optimal_gamma(1.0, 0.0, max_gamma=7) == 7


def test_optimal_gamma_is_the_argmax_of_theorem_3_8() -> None:
    alpha, c = 0.75, 0.05
    gamma = optimal_gamma(alpha, c)
    best = walltime_improvement(alpha, gamma, c)
    assert best > walltime_improvement(alpha, gamma - 1, c)
    assert best > walltime_improvement(alpha, gamma + 1, c)


@given(
    alpha=st.floats(0.0, 1.0),
    k=st.integers(0, 12),
    measured=st.integers(1, 8),
    c=st.floats(0.0, 1.0),
)
def test_iid_positions_give_theorem_3_8_measured_or_extrapolated(
    alpha: float, k: int, measured: int, c: float
) -> None:
    """With p_i = alpha^(i+1) the measured formula is Leviathan's, and the geometric tail is exact."""
    assert math.isclose(
        speedup_at(geometric(alpha, measured), k, c),
        walltime_improvement(alpha, k, c),
        rel_tol=1e-9,
        abs_tol=1e-12,
    )


def test_speedup_at_uses_the_measured_positions_as_they_are() -> None:
    p = [0.8, 0.5, 0.2]  # not geometric: the later positions fall fast
    assert speedup_at(p, 2, 0.1) == pytest.approx((1 + 0.8 + 0.5) / 1.2)
    assert speedup_at(p, 3, 0.0) == pytest.approx(2.5)
    assert speedup_at(p, 0, 0.3) == 1.0  # no speculation: plain decoding


def test_the_tail_continues_at_the_mean_rate_of_the_last_positions_after_the_first() -> None:
    p = [0.9, 0.72, 0.504, 0.3024]  # conditional 0.9, then 0.8, 0.7, 0.6
    assert tail_rate(p) == pytest.approx(0.7)
    assert extended_positions(p, 6) == pytest.approx([*p, 0.3024 * 0.7, 0.3024 * 0.49])
    assert speedup_at(p, 6, 0.0) == pytest.approx(1 + sum(p) + 0.3024 * (0.7 + 0.49))


def test_one_measured_position_is_its_own_tail() -> None:
    assert tail_rate([0.6]) == pytest.approx(0.6)
    assert extended_positions([0.6], 3) == pytest.approx([0.6, 0.36, 0.216])


def test_noisy_positions_never_make_the_tail_rise() -> None:
    assert tail_rate([0.5, 0.55]) == 1.0  # 0.55/0.5 = 1.1, capped
    assert extended_positions([0.5, 0.55], 4) == pytest.approx([0.5, 0.55, 0.55, 0.55])


@given(st.lists(st.floats(0.0, 1.0), max_size=10).map(lambda xs: sorted(xs, reverse=True)))
def test_conditional_rates_multiply_back_to_the_per_position_rates(per_position: list[float]) -> None:
    rates = conditional_rates(per_position)
    assert len(rates) == len(per_position)
    assert all(0.0 <= rate <= 1.0 for rate in rates)
    assert list(per_position) == pytest.approx(
        [math.prod(rates[: i + 1]) for i in range(len(rates))], rel=1e-9, abs=1e-12
    )


def test_conditional_rates_of_the_eagle_paper_example() -> None:
    # The reference's Vicuna 33B row: conditional 0.74 0.69 0.67 0.67 0.66 → p .740 .511 .342 .229 .151.
    rates = conditional_rates([0.740, 0.511, 0.342, 0.229, 0.151])
    assert [round(rate, 2) for rate in rates] == [0.74, 0.69, 0.67, 0.67, 0.66]


def test_positions_after_an_unreached_one_get_rate_zero() -> None:
    assert conditional_rates([0.4, 0.0, 0.0]) == [0.4, 0.0, 0.0]
    assert conditional_rates([0.0, 0.0]) == [0.0, 0.0]
    assert conditional_rates([]) == []


def test_without_measured_positions_only_k_0_has_a_speedup() -> None:
    assert speedup_at([], 0, 0.05) == 1.0
    with pytest.raises(ValueError, match="no measured positions"):
        speedup_at([], 1, 0.05)
    with pytest.raises(ValueError, match="no measured positions"):
        best_k([], 0.05)


def test_best_k_drafts_more_when_drafts_are_free_and_accepted() -> None:
    result = best_k(geometric(0.9, 5), 0.0, k_max=8)
    assert result.k == 8
    assert result.extrapolated


def test_best_k_drafts_less_when_drafts_are_expensive() -> None:
    assert best_k(geometric(0.9, 5), 0.5).k < best_k(geometric(0.9, 5), 0.02).k
    # A draft step as dear as a target step: one token at a time loses least.
    assert best_k(geometric(0.9, 5), 1.0).k == 1
    cheap = best_k(geometric(0.7, 5), 0.05)
    dear = best_k(geometric(0.7, 5), 0.25)
    assert dear.k < cheap.k


def test_best_k_table_marks_the_positions_past_the_measured_ones() -> None:
    p = [0.8, 0.6, 0.45]
    result = best_k(p, 0.02, k_max=5)
    assert [row.k for row in result.table] == [1, 2, 3, 4, 5]
    assert [row.extrapolated for row in result.table] == [False, False, False, True, True]
    k, speedup, extrapolated = result.table[1]
    assert (k, extrapolated) == (2, False)
    assert speedup == pytest.approx((1 + 0.8 + 0.6) / 1.04)
    assert result.speedup == max(row.speedup for row in result.table)
    assert result.table[result.k - 1].speedup == result.speedup


def test_best_k_reports_the_current_k_and_the_gain_over_it() -> None:
    p = geometric(0.6, 5)
    result = best_k(p, 0.1, current_k=5)
    assert result.current_k == 5
    current = speedup_at(p, 5, 0.1)
    assert result.current_speedup == pytest.approx(current)
    assert result.gain == pytest.approx(result.speedup / current - 1)
    assert result.gain is not None and result.gain > 0
    assert best_k(p, 0.1).gain is None


def test_a_current_k_past_k_max_still_gets_its_speedup() -> None:
    p = geometric(0.8, 10)
    result = best_k(p, 0.05, k_max=4, current_k=10)
    assert result.current_speedup == pytest.approx(walltime_improvement(0.8, 10, 0.05))


def test_best_k_breaks_ties_towards_the_smaller_k() -> None:
    # Nothing accepted and free drafts: every k is plain decoding's speed.
    result = best_k([0.0, 0.0, 0.0], 0.0)
    assert {row.speedup for row in result.table} == {1.0}
    assert result.k == 1


def test_best_k_needs_at_least_one_k() -> None:
    with pytest.raises(ValueError, match="k_max"):
        best_k([0.5], 0.0, k_max=0)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0])
@pytest.mark.parametrize("c", [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5])
def test_best_k_on_geometric_positions_agrees_with_optimal_gamma(alpha: float, c: float) -> None:
    result = best_k(geometric(alpha, 5), c, k_max=8)
    assert isinstance(result, BestK)
    assert result.k == optimal_gamma(alpha, c, max_gamma=8)
    assert result.speedup == pytest.approx(walltime_improvement(alpha, result.k, c))
