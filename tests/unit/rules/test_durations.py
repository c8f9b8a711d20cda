"""Durations written the Prometheus way, and their shortest spelling."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from specguard.rules.durations import Duration, format_duration, format_wait, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1s500ms", 1.5),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1.5h", 5400.0),
        ("0", 0.0),
        ("0s", 0.0),
        (" 10m ", 600.0),
    ],
)
def test_prometheus_duration_strings_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("number", "seconds"), [(0, 0.0), (30, 30.0), (1.5, 1.5), (0.25, 0.25)])
def test_plain_numbers_are_seconds(number: float, seconds: float) -> None:
    value = parse_duration(number)
    assert value == seconds
    assert isinstance(value, float)


@pytest.mark.parametrize(
    "value",
    [
        "5 minutes",
        "-1",
        "-1s",
        "1x",
        "",
        "   ",
        "s",
        "5",  # a string needs a unit: only a YAML number is seconds
        "1h 30m",
        "m5",
        "5mm",
        "1.s",
        True,
        False,
        None,
        [30],
        {"s": 30},
    ],
)
def test_malformed_durations_are_rejected_with_an_example(value: object) -> None:
    with pytest.raises(ValueError, match="30s"):
        parse_duration(value)


@pytest.mark.parametrize("value", [-1, -0.5])
def test_negative_numbers_are_rejected(value: float) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_duration(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_not_durations(value: float) -> None:
    # YAML `.nan` / `.inf` are floats; a NaN `for:` would make a rule never fire.
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-5, "0s"),
        (0.0004, "0s"),
        (0.5, "500ms"),
        (1, "1s"),
        (90, "1m30s"),
        (300, "5m"),
        (5400, "1h30m"),
        (86400, "1d"),
        (604800 + 3600 + 1.001, "1w1h1s1ms"),
    ],
)
def test_format_duration_writes_the_shortest_prometheus_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


millis = st.integers(min_value=0, max_value=10 * 604_800_000)


@given(millis)
def test_format_then_parse_gives_back_the_same_milliseconds(count: int) -> None:
    seconds = count / 1000
    assert round(parse_duration(format_duration(seconds)) * 1000) == count


@given(millis)
def test_formatting_is_stable_through_a_round_trip(count: int) -> None:
    text = format_duration(count / 1000)
    assert format_duration(parse_duration(text)) == text


class _Model(BaseModel):
    wait: Duration


def test_the_pydantic_field_accepts_strings_and_numbers_and_holds_seconds() -> None:
    assert _Model(wait="2m").wait == 120.0  # type: ignore[arg-type]
    assert _Model(wait=7).wait == 7.0


def test_the_pydantic_field_reports_the_operator_message() -> None:
    with pytest.raises(ValidationError, match="invalid duration '5 minutes'"):
        _Model(wait="5 minutes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.2, "200ms"), (0.9994, "999ms"), (7.4, "7s"), (7.6, "8s"), (300.2, "5m")]
)
def test_a_wait_is_shown_in_whole_seconds_from_a_second_up_and_in_milliseconds_below(
    seconds: float, shown: str
) -> None:
    assert format_wait(seconds) == shown
