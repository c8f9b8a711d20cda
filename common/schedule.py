"""Crontab schedules (the weekly report's): parsing, and the times one fired."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

# Day-of-week as crontab(5) counts it: 0 and 7 are Sunday.
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def cron(expression: str, timezone: str = "UTC") -> Any:
    """The APScheduler trigger of a crontab line; ValueError with the reason when it is wrong."""
    from apscheduler.triggers.cron import CronTrigger

    try:
        fields = expression.split()
        if len(fields) == 5:
            fields[4] = weekdays(fields[4])
        return CronTrigger.from_crontab(" ".join(fields), timezone=timezone)
    except LookupError as exc:  # zoneinfo's ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"unknown time zone {timezone!r}") from exc
    except ValueError as exc:
        raise ValueError(
            f"{expression!r} is not a crontab schedule (minute hour day month weekday): {exc}"
        ) from exc


def weekdays(field: str) -> str:
    """A crontab day-of-week field as APScheduler's day names. APScheduler numbers the days from
    Monday = 0, crontab from Sunday = 0 (and 7): handed over as it is, ``0 8 * * 1`` would run on
    Tuesdays. Names, numbers, ranges, lists and steps are read as crontab(5) reads them."""
    if field in ("*", "?"):
        return field
    days: set[int] = set()
    for part in field.lower().split(","):
        span, _, every = part.partition("/")
        step = _number(every, "step") if every else 1
        if step < 1:
            raise ValueError(f"day-of-week step {every!r} must be at least 1")
        if span == "*":
            first, last = 0, 6
        elif "-" in span:
            low, _, high = span.partition("-")
            first, last = _day(low), _day(high)
            if first > last:
                raise ValueError(f"day-of-week range {span!r} runs backwards")
        else:
            first = _day(span)
            last = 6 if every else first  # "1/2": from Monday to the end of the week
        days.update(day % 7 for day in range(first, last + 1, step))
    return ",".join(_DAYS[day] for day in sorted(days))


def _day(text: str) -> int:
    if text in _DAYS:
        return _DAYS.index(text)
    day = _number(text, "day of week")
    if not 0 <= day <= 7:
        raise ValueError(f"day of week {text!r} is not 0-7 (0 and 7 are Sunday) or sun-sat")
    return day


def _number(text: str, what: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{what} {text!r} is not a number or a day name (sun-sat)")
    return int(text)


def last_due(trigger: Any, since: datetime, now: datetime) -> datetime | None:
    """The latest time ``trigger`` fired in ``(since, now]``, or None."""
    found = None
    for moment in _fires(trigger, since + timedelta(seconds=1)):
        if moment > now:
            break
        found = moment
    return found


def previous_fire(trigger: Any, before: datetime, earliest: datetime) -> datetime | None:
    """The latest time ``trigger`` fired before ``before`` and not before ``earliest``, or None.
    APScheduler only counts forward, so it is looked for in spans doubling back from ``before``: a
    schedule of every minute is not walked through minute by minute from ``earliest``."""
    before, earliest = before.astimezone(UTC), earliest.astimezone(UTC)  # spans of real time
    span = timedelta(minutes=1)
    while True:
        start = max(before - span, earliest)
        found = None
        for moment in _fires(trigger, start):
            if moment >= before:
                break
            found = moment
        if found is not None or start == earliest:
            return found
        span *= 2


def _fires(trigger: Any, start: datetime) -> Iterator[datetime]:
    """The times ``trigger`` fires at or after ``start``, in order."""
    moment = trigger.get_next_fire_time(None, start)
    while moment is not None:
        yield moment
        moment = trigger.get_next_fire_time(moment, moment + timedelta(seconds=1))
