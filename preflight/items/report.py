"""Item 10: the weekly report is scheduled (``report.schedule``) and the last one was written.

The daemon records every scheduled report it makes in the state database's ``reports`` table, by
the time it was scheduled for, with its files. The last time the schedule fired (``SLACK`` ago or
earlier, time enough to make it) must have its row, and its files must still be there. A schedule
that has not fired since the daemon first saw it has no report due yet: unknown, and said when the
first one is due."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.window import Unreadable, query

NUMBER = 10
KEY = "report"
TITLE = "weekly report scheduled and written"

SLACK = 3600.0  # seconds after its scheduled time a report may still be in the making


@dataclass(frozen=True)
class Written:
    scheduled: float
    made: float
    paths: tuple[str, ...]


def _when(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _read(db: sqlite3.Connection) -> tuple[Written | None, float | None]:
    """The newest scheduled report and when the schedule was first seen."""
    from specguard.report.weekly import newest, scheduled_since

    found, since = newest(db), scheduled_since(db)
    return (Written(found[0], found[1], tuple(found[2])) if found else None), since


async def check(ctx: Context) -> Answer:
    from specguard.common.schedule import cron, previous_fire
    from specguard.rules.durations import format_duration

    loaded = ctx.loaded
    config = str(ctx.config_file) if ctx.config_file is not None else "CONFIG"
    if "report" in loaded.invalid_keys:
        said = tuple(str(p) for p in loaded.errors if p.field.split(".")[0] == "report")
        return Answer(Status.FAIL, ("the config's report: section is refused:", *said), "correct report:")
    report = loaded.config.report
    if report.schedule is None:
        return Answer(
            Status.FAIL,
            ("report.schedule is null: the daemon makes no weekly report",),
            'set report.schedule (e.g. "0 8 * * mon") and reload the daemon: systemctl reload specguard',
        )
    trigger = cron(report.schedule, report.timezone)
    facts = [f"report.schedule {report.schedule!r} ({report.timezone}), formats {', '.join(report.formats)}"]
    store = ctx.store_file
    if store is None or not store.is_file():
        return Answer(
            Status.FAIL,
            (
                *facts,
                f"no state database{f' at {store}' if store else ''}: the daemon has not run, no report written",
            ),
            "start the daemon: systemctl enable --now specguard",
        )
    try:
        written, since = await query(store, _read)
    except (Unreadable, ValueError) as exc:
        return Answer(Status.UNKNOWN, (*facts, f"cannot read the reports in {store}: {exc}"))
    moment = datetime.fromtimestamp(ctx.now - SLACK, UTC)
    due_at = previous_fire(trigger, moment, datetime.fromtimestamp(since or ctx.now, UTC))
    due = due_at.timestamp() if due_at is not None else None
    if due is not None:
        facts.append(f"the last one due was scheduled for {_when(due)}")
    if written is not None:
        facts.append(
            f"last report: scheduled {_when(written.scheduled)}, written {_when(written.made)}: "
            f"{', '.join(written.paths) or 'no files'}"
        )
    if due is None or (since is not None and due < since):
        upcoming = trigger.get_next_fire_time(None, datetime.fromtimestamp(ctx.now, UTC))
        first = f"; the next is due {_when(upcoming.timestamp())}" if upcoming is not None else ""
        if written is not None:
            return Answer(Status.PASS, (*facts, f"no later report due yet{first}"))
        seen = _when(since) if since is not None else "never (the daemon has not run with it)"
        return Answer(
            Status.UNKNOWN,
            (*facts, f"the schedule was first seen {seen} and has not fired since{first}: no report due yet"),
            "none until it is due: check again after it",
        )
    if written is None or written.scheduled < due:
        return Answer(
            Status.FAIL,
            (*facts, "it was not written" + ("" if written else ": no scheduled report was ever written")),
            "see why: journalctl -u specguard | grep -i report (the daemon makes the latest missed report when "
            f"it starts again); a report now: specguard report --config {config} --since {format_duration(report.period)}",
        )
    gone = [p for p in written.paths if not Path(p).is_file()]
    if not written.paths or gone:
        return Answer(
            Status.FAIL,
            (*facts, f"its files are gone: {', '.join(gone)}" if gone else "it lists no files"),
            f"keep report.out_dir ({loaded.config.reports_dir()}) from being cleaned; a report now: "
            f"specguard report --config {config} --since {format_duration(report.period)} --out {loaded.config.reports_dir()}",
        )
    return Answer(Status.PASS, tuple(facts))
