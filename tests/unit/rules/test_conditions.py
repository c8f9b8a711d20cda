"""Conditions: parsing the operator and threshold, resolving baseline-relative thresholds."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specguard.rules.conditions import Condition, MissingBaseline, parse_condition

OPERATORS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@pytest.mark.parametrize("op", sorted(OPERATORS))
def test_every_operator_parses_with_a_constant_threshold(op: str) -> None:
    condition = parse_condition(f"{op} 0.5")
    assert condition.op == op
    assert condition.constant == 0.5
    assert condition.baseline_signal is None
    assert condition.threshold(None) == 0.5


@pytest.mark.parametrize(
    ("op", "value", "breached"),
    [
        ("<", 0.4, True),
        ("<", 0.5, False),
        ("<=", 0.5, True),
        ("<=", 0.6, False),
        (">", 0.6, True),
        (">", 0.5, False),
        (">=", 0.5, True),
        (">=", 0.4, False),
        ("==", 0.5, True),
        ("==", 0.4, False),
        ("!=", 0.4, True),
        ("!=", 0.5, False),
    ],
)
def test_breached_compares_the_value_with_the_threshold(op: str, value: float, breached: bool) -> None:
    assert parse_condition(f"{op} 0.5").breached(value, 0.5) is breached


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        ("1", 1.0),
        ("0.5", 0.5),
        (".5", 0.5),
        ("1.", 1.0),
        ("1e-3", 0.001),
        ("1E3", 1000.0),
        ("2.5e+2", 250.0),
        ("-2", -2.0),
        ("+3", 3.0),
        ("-0.25", -0.25),
        ("0", 0.0),
    ],
)
def test_numbers_are_accepted_in_every_usual_form(number: str, expected: float) -> None:
    assert parse_condition(f"> {number}").constant == expected


@pytest.mark.parametrize(
    "text",
    ["<0.5", "< 0.5", "  <   0.5  ", "<\t0.5", "< 0.5\n", " <0.5"],
)
def test_whitespace_around_and_between_the_parts_does_not_matter(text: str) -> None:
    condition = parse_condition(text)
    assert (condition.op, condition.constant) == ("<", 0.5)


def test_the_text_is_kept_with_whitespace_normalised() -> None:
    assert parse_condition("  >   1.2  *  baseline.ttft_p95 ").text == "> 1.2 * baseline.ttft_p95"
    assert str(parse_condition("< 0.5")) == "< 0.5"


@pytest.mark.parametrize(
    ("text", "factor"),
    [
        ("> 1.2 * baseline.e2e_latency_p95", 1.2),
        ("> 1.2*baseline.e2e_latency_p95", 1.2),
        ("> baseline.e2e_latency_p95 * 1.2", 1.2),
        ("> baseline.e2e_latency_p95*1.2", 1.2),
        ("> baseline.e2e_latency_p95", 1.0),
        (">= 2 * baseline.e2e_latency_p95", 2.0),
        ("< .5 * baseline.e2e_latency_p95", 0.5),
    ],
)
def test_baseline_relative_forms_parse_to_a_factor_and_a_signal(text: str, factor: float) -> None:
    condition = parse_condition(text)
    assert condition.baseline_signal == "e2e_latency_p95"
    assert condition.factor == factor
    assert condition.constant is None


def test_a_baseline_threshold_is_the_factor_times_the_baseline_value() -> None:
    condition = parse_condition("> 1.5 * baseline.e2e_latency_p95")
    assert condition.threshold({"e2e_latency_p95": 2.0, "ttft_p95": 0.1}) == pytest.approx(3.0)
    assert parse_condition("> baseline.ttft_p95").threshold({"ttft_p95": 0.25}) == 0.25


def test_a_constant_threshold_ignores_the_baseline() -> None:
    assert parse_condition("< 0.5").threshold({"e2e_latency_p95": 9.0}) == 0.5


def test_missing_baseline_when_no_baseline_is_configured() -> None:
    condition = parse_condition("> 1.2 * baseline.e2e_latency_p95")
    with pytest.raises(MissingBaseline, match="no baseline file is configured"):
        condition.threshold(None)


def test_missing_baseline_when_the_baseline_lacks_the_signal() -> None:
    condition = parse_condition("> 1.2 * baseline.e2e_latency_p95")
    with pytest.raises(MissingBaseline, match="no value for 'e2e_latency_p95'"):
        condition.threshold({"ttft_p95": 0.2})


def test_missing_baseline_is_a_lookup_error() -> None:
    assert issubclass(MissingBaseline, LookupError)


@pytest.mark.parametrize(
    "text",
    [
        "<< 1",
        "0.5",
        "> abc",
        "> 1.2 * baseline.",
        "",
        "   ",
        "=> 1",
        "= 1",
        "> 1 2",
        "> 0.5 and < 0.9",
        "> 1.2 * ",
        "> baseline.E2E",
        "> 1.2 * baseline.e2e_latency_p95 +",
        "> nan",
        "> inf",
        "< 0.5%",
    ],
)
def test_malformed_conditions_are_rejected_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_condition(text)
    message = str(info.value)
    assert repr(text) in message
    assert "< 0.5" in message  # an example of a good condition
    assert "baseline" in message


def test_a_baseline_factor_given_on_both_sides_is_rejected() -> None:
    with pytest.raises(ValueError, match="give the baseline factor once"):
        parse_condition("> 1.2 * baseline.e2e_latency_p95 * 2")


@pytest.mark.parametrize("value", [0.5, 1, None, ["< 0.5"]])
def test_a_non_string_is_rejected_with_a_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="invalid condition"):
        parse_condition(value)  # type: ignore[arg-type]


def test_condition_is_a_frozen_value() -> None:
    assert parse_condition("< 0.5") == parse_condition("< 0.5")
    assert isinstance(parse_condition("< 0.5"), Condition)
    with pytest.raises(AttributeError):
        parse_condition("< 0.5").op = ">"  # type: ignore[misc]


finite = st.floats(allow_nan=False, allow_infinity=False)


@given(op=st.sampled_from(sorted(OPERATORS)), number=finite, value=finite)
def test_breached_agrees_with_the_python_operator(op: str, number: float, value: float) -> None:
    condition = parse_condition(f"{op} {number!r}")
    threshold = condition.threshold(None)
    assert threshold == number
    assert condition.breached(value, threshold) is OPERATORS[op](value, number)
    assert condition.breached(number, threshold) is OPERATORS[op](number, number)


@given(
    op=st.sampled_from(sorted(OPERATORS)),
    factor=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    base=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_baseline_threshold_is_factor_times_baseline_for_any_factor(
    op: str, factor: float, base: float
) -> None:
    condition = parse_condition(f"{op} {factor!r} * baseline.ttft_p95")
    assert condition.op == op
    assert condition.threshold({"ttft_p95": base}) == factor * base
