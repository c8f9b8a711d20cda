"""Making a report: once from ``specguard report``, or on the daemon's weekly schedule.

The schedule is a cron expression (APScheduler's ``CronTrigger``); a scheduled report covers the
time since the schedule's previous run (``period_of``). What makes it safe to leave
running is the ``reports`` table: a report is recorded by the time it was scheduled for, so a
report missed while the daemon was down is made once when it starts again (only the latest one
missed, and only for a time after the schedule was first seen), and never twice. The files are
written before the row: a crash between the two makes the same files again, under the same names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from specguard.common.schedule import last_due, previous_fire
from specguard.config.routing import RoutingConfig
from specguard.report.build import build
from specguard.report.model import Report
from specguard.report.traffic import pools_of
from specguard.store.baseline import Baseline
from specguard.store.connection import transaction
from specguard.store.database import Store

log = logging.getLogger("specguard.report")

SINCE_KEY = "reports_scheduled_since"  # meta: when the schedule was first seen by this store
# Further back than the runs of any crontab line are apart (29 February: eight years across 2100).
FURTHEST = timedelta(days=9 * 366)


def charts_missing() -> str | None:
    from specguard.report import charts

    return charts.available()


async def make(
    store: Store,
    start: float,
    end: float,
    formats: Sequence[str],
    out_dir: Path,
    baseline: Baseline | None,
    host: str | None = None,
    remedies: Collection[str] = (),
    routing: RoutingConfig | None = None,
) -> tuple[Report, list[Path]]:
    """Build the report of ``[start, end)`` and write it in each of ``formats`` into ``out_dir``
    (``remedies``: the names of the actions that change the world, see ``build``; ``routing``: the
    config's routing section, whose pools say which servers each traffic class went to)."""
    missing = charts_missing()
    now = time.time()
    report = await store.call(
        lambda db: build(
            db,
            start,
            end,
            baseline=baseline,
            host=host or socket.gethostname(),
            now=now,
            charts_missing=missing,
            remedies=remedies,
            pools=pools_of(routing),
        ),
        synced=False,
    )
    paths = await asyncio.to_thread(_write, report, formats, out_dir)
    return report, paths


def _write(report: Report, formats: Sequence[str], out_dir: Path) -> list[Path]:
    from specguard.report import charts, render

    drawn = charts.charts(report) if charts.available() is None else []  # once for every format
    paths: list[Path] = []
    for fmt in formats:
        paths.extend(render.write(report, fmt, out_dir, drawn))
    return paths


async def post(store: Store, actions: Mapping[str, Any], name: str, report: Report, out_dir: Path) -> str:
    """Queue ``report``'s summary and charts in the outbox of the slack action ``name``; the
    dispatcher's loop delivers them (retried, never twice: the report's period is its id)."""
    from specguard.actions.slack import SlackAction
    from specguard.report import charts, render
    from specguard.report.slack import summary
    from specguard.store.memory import StoreMemory

    action = actions.get(name)
    if not isinstance(action, SlackAction):
        raise ValueError(f"report.slack: {name!r} is not a slack action")
    text, blocks = summary(report)

    def draw() -> list[tuple[str, str]]:  # off the event loop: matplotlib takes a second a series
        drawn = charts.charts(report) if charts.available() is None else []
        pngs = render.write_charts(report, drawn, out_dir)
        return [(str(png), chart.title) for png, chart in zip(pngs, drawn, strict=True)]

    files = await asyncio.to_thread(draw)
    return await action.queue_report(
        StoreMemory(store, name), render.filename_stem(report), text, blocks, files
    )


# --- the daemon's schedule ---------------------------------------------------------------------


def _since(db: sqlite3.Connection, now: float) -> float:
    """When this store first saw a report schedule (recorded now if never)."""
    with transaction(db):
        db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (SINCE_KEY, repr(now)))
        row = db.execute("SELECT value FROM meta WHERE key=?", (SINCE_KEY,)).fetchone()
    return float(row[0])


def newest(db: sqlite3.Connection) -> tuple[float, float, list[str]] | None:
    """The latest scheduled report made: (scheduled, made, its files), or None (``preflight``)."""
    row = db.execute("SELECT scheduled, made, paths FROM reports ORDER BY scheduled DESC LIMIT 1").fetchone()
    if row is None:
        return None
    paths = json.loads(row[2]) if isinstance(row[2], str) else []
    return float(row[0]), float(row[1]), [str(p) for p in paths if isinstance(p, str)]


def scheduled_since(db: sqlite3.Connection) -> float | None:
    """When this store first saw a report schedule, without recording it; None: never."""
    row = db.execute("SELECT value FROM meta WHERE key=?", (SINCE_KEY,)).fetchone()
    return None if row is None else float(row[0])


def _made(db: sqlite3.Connection, scheduled: float) -> bool:
    return db.execute("SELECT 1 FROM reports WHERE scheduled=?", (scheduled,)).fetchone() is not None


def _record(db: sqlite3.Connection, scheduled: float, start: float, end: float, paths: list[Path]) -> bool:
    with transaction(db):
        cursor = db.execute(
            "INSERT OR IGNORE INTO reports (scheduled, made, period_from, period_to, paths) VALUES (?, ?, ?, ?, ?)",
            (scheduled, time.time(), start, end, json.dumps([str(p) for p in paths])),
        )
    return cursor.rowcount == 1


async def missed(store: Store, trigger: Any, now: float, retention: float) -> float | None:
    """The scheduled time of a report the daemon missed while it was down, if there is one: the
    latest, and none older than history's ``retention`` (seconds), which no longer holds its week."""
    since = await store.call(lambda db: _since(db, now))
    moment = datetime.fromtimestamp(now, UTC)
    earliest = max(datetime.fromtimestamp(since, UTC), moment - timedelta(seconds=retention))
    due = last_due(trigger, earliest, moment)
    if due is None:
        return None
    scheduled = due.timestamp()
    return None if await store.call(lambda db: _made(db, scheduled)) else scheduled


def period_of(trigger: Any, scheduled: float, least: float) -> tuple[float, float]:
    """The period ``[start, scheduled)`` of the report scheduled for ``scheduled``: from the
    schedule's previous time, so that consecutive reports count no hour twice and leave none out
    whatever the clocks did in between, or from ``least`` seconds before ``scheduled`` if that is
    earlier (also when the schedule has no previous time). ``least`` is counted on the schedule's
    clock: 7 days before a Monday 08:00 is the Monday before at 08:00, 167 or 169 hours before
    when the clocks changed in between."""
    moment = datetime.fromtimestamp(scheduled, trigger.timezone)
    earliest = (moment - timedelta(seconds=least)).timestamp()  # in one zone: arithmetic on its clock
    previous = previous_fire(trigger, moment, moment.astimezone(UTC) - FURTHEST)
    start = earliest if previous is None else min(previous.timestamp(), earliest)
    return start, scheduled


async def scheduled_report(
    store: Store,
    trigger: Any,
    scheduled: float,
    least: float,
    formats: Sequence[str],
    out_dir: Path,
    baseline: Baseline | None,
    deliver: Callable[[Report], Awaitable[None]] | None = None,
    remedies: Collection[str] = (),
    routing: RoutingConfig | None = None,
) -> tuple[Report, list[Path]] | None:
    """Make the report ``trigger`` scheduled for ``scheduled`` (of its ``period_of``, at least
    ``least`` long) unless it was made already; its files, or None when it had been made.
    ``deliver`` (queueing it for Slack, which ignores a report it has queued before) runs before
    the report is recorded as made: a crash between the two makes it again and delivers it once,
    never not at all."""
    if await store.call(lambda db: _made(db, scheduled)):
        return None
    start, end = period_of(trigger, scheduled, least)
    report, paths = await make(
        store, start, end, formats, out_dir, baseline, remedies=remedies, routing=routing
    )
    if deliver is not None:
        await deliver(report)
    if not await store.call(lambda db: _record(db, scheduled, start, end, paths)):
        return None
    log.info(
        "weekly report of %s written: %s",
        datetime.fromtimestamp(scheduled, UTC).date(),
        ", ".join(map(str, paths)),
    )
    return report, paths
