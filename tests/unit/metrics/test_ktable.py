"""The k table as text, as the weekly report and `specguard tune` both print it."""

from __future__ import annotations

from specguard.metrics.ktable import fmt, k_inputs, k_table
from specguard.metrics.speedup import best_k


def test_numbers_keep_three_significant_digits_and_large_counts_are_whole() -> None:
    assert fmt(0.129600) == "0.13"
    assert fmt(2.4512) == "2.45"
    assert fmt(123456.7) == "123,457"


def test_the_inputs_name_the_rates_the_cost_with_its_source_and_the_formula() -> None:
    lines = k_inputs([0.6, 0.36, 0.216], 0.2, "bench --against")
    assert lines[0].startswith("Measured per-position acceptance p_0..p_2")
    assert lines[0].endswith(": 0.6, 0.36, 0.216.")
    assert lines[1] == "Draft cost c = 0.2 (bench --against)."
    assert "(1 + Σ_{i<k} p_i) / (1 + k·c)" in lines[2]
    assert k_inputs([0.5], 0.1, None)[1] == "Draft cost c = 0.1."


def test_every_k_has_a_line_marked_current_best_and_extrapolated() -> None:
    geometric = [0.6, 0.36, 0.216]
    result = best_k(geometric, 0.2, k_max=4, current_k=3)
    lines = k_table(result, geometric)
    assert lines[0].startswith("Past k = 3 the p_i are extrapolated: each further position keeps 0.6")
    assert lines[1:] == [
        "k = 1: speedup 1.33",
        "k = 2: speedup 1.4 (best)",
        "k = 3: speedup 1.36 (current)",
        "k = 4: speedup 1.28 (extrapolated)",
    ]


def test_no_extrapolation_line_when_every_k_was_measured() -> None:
    result = best_k([0.9, 0.8], 0.05, k_max=2)
    assert k_table(result, [0.9, 0.8]) == ["k = 1: speedup 1.81", "k = 2: speedup 2.45 (best)"]
