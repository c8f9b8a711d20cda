"""Crontab schedules (the weekly report's): parsing, and the latest time one fired."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any


def cron(expression: str, timezone: str = "UTC") -> Any:
    """The APScheduler trigger of a crontab line; ValueError with the reason when it is wrong."""
    from apscheduler.triggers.cron import CronTrigger

    try:
        return CronTrigger.from_crontab(expression, timezone=timezone)
    except LookupError as exc:  # zoneinfo's ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"unknown time zone {timezone!r}") from exc
    except ValueError as exc:
        raise ValueError(
            f"{expression!r} is not a crontab schedule (minute hour day month weekday): {exc}"
        ) from exc


def last_due(trigger: Any, since: datetime, now: datetime) -> datetime | None:
    """The latest time ``trigger`` fired in ``(since, now]``, or None."""
    found = None
    moment = trigger.get_next_fire_time(None, since + timedelta(seconds=1))
    while moment is not None and moment <= now:
        found = moment
        moment = trigger.get_next_fire_time(moment, moment + timedelta(seconds=1))
    return found
