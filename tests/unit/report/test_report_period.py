"""The period of a scheduled report: from the schedule's previous time to this one, on the clock of
``report.timezone``, so that consecutive reports tile time across daylight-saving changes (a week
of 167 or 169 hours is reported whole, no hour twice and none left out)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.report import weekly

BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"


def eight(zone: str, month: int, day: int) -> float:
    """08:00 on the clock of ``zone`` that day of 2026, as a timestamp (by calendar arithmetic)."""
    return datetime(2026, month, day, 8, 0, tzinfo=ZoneInfo(zone)).timestamp()


def shown(moment: float, zone: str) -> str:
    """A timestamp on the clock of ``zone``, with its offset: what an assertion shows best."""
    return datetime.fromtimestamp(moment, ZoneInfo(zone)).isoformat(timespec="minutes")


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any) -> AsyncIterator[Daemon]:
    """A daemon (not started) on the schedule of Mondays 08:00 in the zone, and with the
    ``report.period``, of the test's parameter; its reports record their period without being drawn."""
    zone, period = request.param
    path = tmp_path / "specguard.yaml"
    path.write_text(
        "state_dir: state\nserver: {port: 0}\nrules: []\n"
        f"report: {{schedule: '0 8 * * mon', timezone: {zone}, period: {period}, formats: [json]}}\n"
    )

    async def make(*_: Any, **__: Any) -> tuple[object, list[Path]]:
        return object(), []

    monkeypatch.setattr(weekly, "make", make)
    made = Daemon(load(path), path, reports=weekly)
    await made.store.open()
    try:
        yield made
    finally:
        await made.store.close()


async def periods(daemon: Daemon, scheduled: list[float]) -> list[tuple[float, float]]:
    """The periods the daemon records for the reports scheduled at ``scheduled``, made in order."""
    for moment in scheduled:
        await daemon.jobs.weekly_report(moment)
    rows = await daemon.store.call(
        lambda db: db.execute("SELECT period_from, period_to FROM reports ORDER BY scheduled").fetchall()
    )
    return [(row[0], row[1]) for row in rows]


# Four Mondays at 08:00 around each change of the clocks: each is the previous fire of the next.
MONDAYS = {
    "berlin-spring": (BERLIN, [eight(BERLIN, 3, 16), eight(BERLIN, 3, 23), eight(BERLIN, 3, 30), eight(BERLIN, 4, 6)]),
    "berlin-autumn": (BERLIN, [eight(BERLIN, 10, m) for m in (12, 19, 26)] + [eight(BERLIN, 11, 2)]),
    "new-york-spring": (NEW_YORK, [eight(NEW_YORK, 3, m) for m in (2, 9, 16, 23)]),
    "new-york-autumn": (NEW_YORK, [eight(NEW_YORK, 10, 26)] + [eight(NEW_YORK, 11, m) for m in (2, 9, 16)]),
}  # fmt: skip


@pytest.mark.parametrize(
    ("daemon", "when", "hours"),
    [
        ((BERLIN, "7d"), "berlin-spring", [168, 167, 168]),  # clocks forward on Sunday 29 March
        ((BERLIN, "7d"), "berlin-autumn", [168, 169, 168]),  # back on Sunday 25 October
        ((NEW_YORK, "7d"), "new-york-spring", [167, 168, 168]),  # forward on Sunday 8 March
        ((NEW_YORK, "7d"), "new-york-autumn", [169, 168, 168]),  # back on Sunday 1 November
    ],
    indirect=["daemon"],
    ids=["berlin-spring", "berlin-autumn", "new-york-spring", "new-york-autumn"],
)
async def test_weekly_reports_across_a_clock_change_run_from_the_previous_monday_and_tile(
    daemon: Daemon, when: str, hours: list[int]
) -> None:
    zone, fires = MONDAYS[when]
    got = await periods(daemon, fires[1:])
    assert [(shown(start, zone), shown(end, zone)) for start, end in got] == [
        (shown(start, zone), shown(end, zone)) for start, end in pairwise(fires)
    ]  # each report covers [previous fire, its fire)
    assert [(end - start) / 3600 for start, end in got] == hours
    assert sum(end - start for start, end in got) == fires[-1] - fires[0]  # no hour twice, none missing


@pytest.mark.parametrize("daemon", [(BERLIN, "1d")], indirect=True)
async def test_a_period_shorter_than_the_weeks_still_reports_the_whole_week(daemon: Daemon) -> None:
    """``report.period`` is the least a report covers: a week's report leaves out no hour of it."""
    _, fires = MONDAYS["berlin-autumn"]
    got = await periods(daemon, fires[2:])
    assert [(shown(start, BERLIN), shown(end, BERLIN)) for start, end in got] == [
        ("2026-10-19T08:00+02:00", "2026-10-26T08:00+01:00"),
        ("2026-10-26T08:00+01:00", "2026-11-02T08:00+01:00"),
    ]


@pytest.mark.parametrize("daemon", [(BERLIN, "14d")], indirect=True)
async def test_a_period_longer_than_the_weeks_is_counted_on_the_schedules_clock(daemon: Daemon) -> None:
    """A fortnight back from the Monday after the spring change is the Monday two weeks before at
    08:00, 335 hours before: each week's report is of the last two weeks."""
    _, fires = MONDAYS["berlin-spring"]
    got = await periods(daemon, fires[2:])
    assert [(shown(start, BERLIN), shown(end, BERLIN)) for start, end in got] == [
        ("2026-03-16T08:00+01:00", "2026-03-30T08:00+02:00"),
        ("2026-03-23T08:00+01:00", "2026-04-06T08:00+02:00"),
    ]
    assert [(end - start) / 3600 for start, end in got] == [335, 335]
