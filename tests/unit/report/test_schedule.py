"""Crontab schedules as crontab(5) reads them, and the times one fired."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from specguard.common.schedule import cron, last_due, previous_fire, weekdays

THURSDAY = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)  # 2026-12-03 is a Thursday


def fire_days(expression: str, weeks: int = 2) -> list[str]:
    """The weekdays a schedule fires on in the ``weeks`` from THURSDAY, in order."""
    trigger = cron(expression)
    days, moment = [], trigger.get_next_fire_time(None, THURSDAY)
    while moment is not None and moment < THURSDAY + timedelta(weeks=weeks):
        days.append(moment.strftime("%a"))
        moment = trigger.get_next_fire_time(moment, moment + timedelta(seconds=1))
    return days


@pytest.mark.parametrize(
    ("field", "days"),
    [
        ("1", ["Mon", "Mon"]),  # APScheduler alone would read 1 as Tuesday
        ("mon", ["Mon", "Mon"]),
        ("0", ["Sun", "Sun"]),
        ("7", ["Sun", "Sun"]),
        ("1-5", ["Fri", "Mon", "Tue", "Wed", "Thu", "Fri", "Mon", "Tue", "Wed", "Thu"]),
        ("mon-fri", ["Fri", "Mon", "Tue", "Wed", "Thu", "Fri", "Mon", "Tue", "Wed", "Thu"]),
        ("5-7", ["Fri", "Sat", "Sun", "Fri", "Sat", "Sun"]),
        ("sun-sat", ["Fri", "Sat", "Sun", "Mon", "Tue", "Wed", "Thu"] * 2),
        ("*/3", ["Sat", "Sun", "Wed", "Sat", "Sun", "Wed"]),  # 0, 3, 6
        ("1,3", ["Mon", "Wed", "Mon", "Wed"]),
    ],
)
def test_the_weekday_field_means_what_it_means_in_crontab(field: str, days: list[str]) -> None:
    assert fire_days(f"0 8 * * {field}") == days


def test_a_week_of_days_and_a_star_are_the_same() -> None:
    assert fire_days("0 8 * * *") == fire_days("0 8 * * 0-6") == fire_days("0 8 * * 1-7")


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("0 8 * * 8", "day of week '8' is not 0-7"),
        ("0 8 * * fri-mon", "range 'fri-mon' runs backwards"),
        ("0 8 * * 1/0", "step '0' must be at least 1"),
        ("0 8 * * monday", "'monday' is not a number or a day name"),
        ("0 8 * *", "is not a crontab schedule"),
        ("0 25 * * mon", "is not a crontab schedule"),
    ],
)
def test_a_wrong_schedule_says_what_is_wrong(expression: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        cron(expression)


def test_an_unknown_time_zone_is_named() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        cron("0 8 * * mon", "Mars/Olympus")


def test_weekdays_leaves_a_star_alone_and_names_numbers() -> None:
    assert weekdays("*") == "*"
    assert weekdays("0,7,1") == "sun,mon"


def test_last_due_is_the_latest_firing_in_the_period() -> None:
    trigger = cron("0 8 * * mon")
    monday = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert last_due(trigger, monday - timedelta(days=20), THURSDAY) == monday
    assert last_due(trigger, monday, THURSDAY) is None  # the period (since, now] starts after it
    assert last_due(trigger, monday - timedelta(seconds=1), monday) == monday  # now itself counts
    assert last_due(trigger, monday + timedelta(hours=1), THURSDAY) is None


def test_last_due_follows_the_schedules_time_zone() -> None:
    trigger = cron("0 8 * * mon", "America/New_York")  # 08:00 in New York is 13:00 UTC in winter
    found = last_due(trigger, THURSDAY - timedelta(days=7), THURSDAY)
    assert found is not None and found.astimezone(UTC) == datetime(2026, 11, 30, 13, 0, tzinfo=UTC)


def test_previous_fire_is_the_latest_firing_before_a_time_on_the_schedules_clock() -> None:
    trigger = cron("0 8 * * mon", "Europe/Berlin")
    after_spring = datetime(2026, 3, 30, 6, 0, tzinfo=UTC)  # Monday 08:00 in Berlin, summer time
    month_before = after_spring - timedelta(days=30)
    found = previous_fire(trigger, after_spring, month_before)  # a firing at ``before`` is not before it
    assert found is not None and found.astimezone(UTC) == datetime(2026, 3, 23, 7, 0, tzinfo=UTC)  # winter
    assert after_spring - found == timedelta(days=7, hours=-1)
    assert previous_fire(trigger, after_spring + timedelta(seconds=1), month_before) == after_spring


def test_previous_fire_looks_no_further_back_than_told() -> None:
    trigger = cron("0 8 1 1 *")  # New Year's Day
    new_year = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
    assert previous_fire(trigger, THURSDAY, THURSDAY - timedelta(days=400)) == new_year
    assert previous_fire(trigger, THURSDAY, new_year) == new_year  # ``earliest`` itself counts
    assert previous_fire(trigger, THURSDAY, new_year + timedelta(seconds=1)) is None


def test_previous_fire_of_a_schedule_of_every_minute_is_the_minute_before() -> None:
    found = previous_fire(cron("* * * * *"), THURSDAY, THURSDAY - timedelta(days=3650))
    assert found == THURSDAY - timedelta(minutes=1)
