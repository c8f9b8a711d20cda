"""The daemon's weekly report: a report missed while it was down is made once at start, posted to
Slack (the loopback Web API) once with its charts, and never made again by a later start; a first
start makes none for a time before it knew the schedule."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.report import weekly
from specguard.sim.slack_api import TOKEN, SlackApi
from specguard.store import history
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition

CONFIG = """
state_dir: state
server: {{port: 0}}
sources: {{scrape: {{targets: ["http://127.0.0.1:9/metrics"]}}}}
report:
  schedule: "0 8 * * mon"
  formats: [html, json]
  slack: reports
actions:
  reports:
    type: slack
    token: {{file: slack-token}}
    channel: C0REPORTS
    base_url: "{url}"
    group_wait: 0s
    backoff: 100ms
    max_backoff: 400ms
"""


def last_monday_eight(now: float) -> float:
    """The latest Monday 08:00 UTC at or before ``now``, by calendar arithmetic."""
    moment = datetime.fromtimestamp(now, UTC)
    monday = (moment - timedelta(days=moment.weekday())).replace(hour=8, minute=0, second=0, microsecond=0)
    if monday > moment:
        monday -= timedelta(days=7)
    return monday.timestamp()


def write_config(tmp_path: Path, api: SlackApi) -> Path:
    (tmp_path / "slack-token").write_text(TOKEN + "\n")
    path = tmp_path / "specguard.yaml"
    path.write_text(CONFIG.format(url=api.url))
    return path


async def seed(path: Path, known_since: float | None, scheduled: float) -> None:
    """A store that has known the schedule since ``known_since`` and has an hour of history in the
    week before ``scheduled``."""
    store = Store(path)
    await store.open()
    start = scheduled - 2 * 86400
    text = (
        'vllm:spec_decode_num_drafts_total{{model_name="m"}} {d}\n'
        'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {t}\n'
        'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {a}\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} {p0}\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="1"}} {p1}\n'
    )
    scrapes = [
        (
            "vllm:8000",
            start + 60 * i,
            parse_exposition(text.format(d=100 * i, t=200 * i, a=70 * i, p0=50 * i, p1=20 * i)),
        )
        for i in range(60)
    ]
    await store.call(lambda db: history.record(db, scrapes))
    if known_since is not None:
        await store.call(
            lambda db: db.execute(
                "INSERT INTO meta VALUES ('reports_scheduled_since', ?)", (repr(known_since),)
            )
        )
    await store.close()


async def wait_for(check: object, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError("not within the time allowed")


async def made(daemon: Daemon) -> list[dict[str, object]]:
    rows = await daemon.store.call(lambda db: db.execute("SELECT * FROM reports").fetchall())
    return [dict(r) for r in rows]


async def test_a_missed_report_is_made_once_at_start_and_posted_once_with_its_charts(
    tmp_path: Path, slack: SlackApi
) -> None:
    config = write_config(tmp_path, slack)
    now = time.time()
    scheduled = last_monday_eight(now)
    await seed(tmp_path / "state" / "specguard.db", scheduled - 14 * 86400, scheduled)
    daemon = Daemon(load(config), config, reports=weekly)
    await daemon.start(handle_signals=False)
    try:
        await wait_for(lambda: _has_rows(daemon))
        (row,) = await made(daemon)
        assert row["scheduled"] == scheduled and row["period_to"] == scheduled
        assert row["period_from"] == scheduled - 7 * 86400
        paths = [Path(p) for p in json.loads(str(row["paths"]))]
        assert {p.suffix for p in paths} == {".html", ".json"} and all(p.is_file() for p in paths)
        report = json.loads(next(p for p in paths if p.suffix == ".json").read_text())
        (series,) = report["series"]
        assert series["headline"]["drafts"]["value"] == 5900  # 59 increases of 100
        await wait_for(lambda: _posted(slack))
        summaries = [m for m in slack.posted() if not m.get("files")]
        charts = [m for m in slack.posted() if m.get("files")]
        assert len(summaries) == 1 and summaries[0]["channel"] == "C0REPORTS"
        assert charts and all(m["thread_ts"] == summaries[0]["ts"] for m in charts)
        written = {p: p.stat().st_mtime_ns for p in paths}
    finally:
        await daemon.shutdown()

    again = Daemon(load(config), config, reports=weekly)
    await again.start(handle_signals=False)
    try:
        await again.jobs.catch_up_report()  # what the start does, awaited here
        await again.jobs.weekly_report(scheduled)  # and the schedule's own run at the same time
        assert len(await made(again)) == 1
        assert {p: p.stat().st_mtime_ns for p in written} == written
        await asyncio.sleep(0.5)  # an outbox pass, were anything queued again
        assert len([m for m in slack.posted() if not m.get("files")]) == 1
        # A crash after the report went to the outbox but before it was recorded as made: the
        # next run makes it again, and Slack still gets it once.
        await again.store.call(lambda db: db.execute("DELETE FROM reports"))
        await again.jobs.weekly_report(scheduled)
        assert len(await made(again)) == 1
        await asyncio.sleep(0.5)
        assert len([m for m in slack.posted() if not m.get("files")]) == 1
    finally:
        await again.shutdown()


async def test_a_first_start_makes_no_report_for_a_time_before_it(tmp_path: Path, slack: SlackApi) -> None:
    config = write_config(tmp_path, slack)
    await seed(tmp_path / "state" / "specguard.db", None, last_monday_eight(time.time()))
    daemon = Daemon(load(config), config, reports=weekly)
    await daemon.start(handle_signals=False)
    try:
        await daemon.jobs.catch_up_report()
        assert await made(daemon) == []
        since = await daemon.store.call(
            lambda db: db.execute("SELECT value FROM meta WHERE key='reports_scheduled_since'").fetchone()[0]
        )
        assert float(since) >= daemon.started_at
    finally:
        await daemon.shutdown()


async def _has_rows(daemon: Daemon) -> bool:
    return bool(await made(daemon))


async def _posted(api: SlackApi) -> bool:
    return any(m.get("files") for m in api.posted())


async def test_with_the_prometheus_source_history_comes_from_its_own_scrape_of_the_servers(
    tmp_path: Path, aiohttp_server: Any
) -> None:
    """Prometheus answers the rules; the servers under `history.scrape` are scraped for history."""
    from aiohttp import web

    page = (Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0-cpu-metrics-self-draft.prom").read_text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    target = f"http://127.0.0.1:{server.port}/metrics"
    path = tmp_path / "specguard.yaml"
    path.write_text(
        "state_dir: state\nserver: {port: 0}\nrules: []\nreport: {schedule: null}\n"
        "sources: {prometheus: {url: 'http://127.0.0.1:9'}}\n"
        f"history: {{scrape: {{targets: ['{target}']}}}}\n"
    )
    daemon = Daemon(load(path), path, reports=weekly)
    await daemon.start(handle_signals=False)
    try:

        async def recorded() -> bool:
            rows = await daemon.store.call(
                lambda db: db.execute("SELECT instance, model FROM history_series").fetchall()
            )
            return [tuple(r) for r in rows] == [(f"127.0.0.1:{server.port}", "tiny-llama")]

        await wait_for(recorded, 30)
    finally:
        await daemon.shutdown()


async def test_a_report_that_could_not_be_queued_for_slack_is_not_recorded_as_made(
    tmp_path: Path, slack: SlackApi
) -> None:
    config = write_config(tmp_path, slack)
    scheduled = last_monday_eight(time.time())
    await seed(tmp_path / "state" / "specguard.db", None, scheduled)
    daemon = Daemon(load(config), config, reports=weekly)
    await daemon.start(handle_signals=False)
    try:
        actions = daemon.dispatcher.actions
        daemon.dispatcher.actions = {}  # the queueing fails: as if the daemon died before it
        await daemon.jobs.weekly_report(scheduled)
        assert await made(daemon) == []  # so the next run makes it again
        daemon.dispatcher.actions = actions
        await daemon.jobs.weekly_report(scheduled)
        assert len(await made(daemon)) == 1
        await wait_for(lambda: _posted(slack))
        assert len([m for m in slack.posted() if not m.get("files")]) == 1
    finally:
        await daemon.shutdown()


async def test_the_schedules_own_run_makes_the_report_of_the_period_before_its_time_once(
    tmp_path: Path, slack: SlackApi
) -> None:
    """APScheduler calls the job with no argument: the run finds the time it was scheduled for
    (here every minute, so the test need not wait for a Monday) and reports the week before it."""
    config = write_config(tmp_path, slack)
    config.write_text(
        config.read_text().replace('"0 8 * * mon"', '"* * * * *"').replace("  slack: reports\n", "")
    )
    before = time.time() // 60 * 60
    await seed(tmp_path / "state" / "specguard.db", before - 86400, before)
    daemon = Daemon(load(config), config, reports=weekly)
    await daemon.start(handle_signals=False)
    try:
        await daemon.jobs.weekly_report()
        after = time.time() // 60 * 60
        rows = await made(daemon)
        assert rows and rows[-1]["scheduled"] in (before, after)  # the minute the call ran in
        assert rows[-1]["period_to"] == rows[-1]["scheduled"]
        assert rows[-1]["period_from"] == rows[-1]["scheduled"] - 7 * 86400
        count = len(rows)
        if time.time() // 60 * 60 == rows[-1]["scheduled"]:  # still the same minute: the same report
            await daemon.jobs.weekly_report()
            assert len(await made(daemon)) == count
    finally:
        await daemon.shutdown()


async def test_no_report_is_caught_up_for_a_time_older_than_history_keeps(tmp_path: Path) -> None:
    """A daemon down for six weeks: the last Monday's report is made, and none for a Monday older
    than history's retention."""
    from specguard.common.schedule import cron
    from specguard.report import weekly

    store = Store(tmp_path / "specguard.db")
    await store.open()
    try:
        now = time.time()
        monday = last_monday_eight(now)
        await store.call(
            lambda db: db.execute(
                "INSERT INTO meta VALUES ('reports_scheduled_since', ?)", (repr(now - 42 * 86400),)
            )
        )
        trigger = cron("0 8 * * mon")
        assert await weekly.missed(store, trigger, now, 14 * 86400) == monday
        # three days after a Monday with a retention of two: that Monday's week is gone from history
        assert await weekly.missed(store, trigger, monday + 3 * 86400, 2 * 86400) is None
        assert await weekly.missed(store, trigger, monday + 3 * 86400, 4 * 86400) == monday
    finally:
        await store.close()
