"""The daemon's schedule: the scheduler and what it runs. The rounds of each interval and the
pruning of alert receipts belong to their parts; the scrapes, the history they record (and its
pruning) and the weekly report are run here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from specguard.common.schedule import cron, last_due
from specguard.daemon.intake import Intake
from specguard.daemon.reports import WeeklyReports
from specguard.daemon.round import Rounds
from specguard.daemon.shared import Shared
from specguard.daemon.wiring import HISTORY_SCRAPE_EVERY, scrape_every
from specguard.rules.durations import format_duration
from specguard.store import history
from specguard.store.database import StoreError

log = logging.getLogger("specguard")


class Jobs:
    """``start`` the scheduler; ``reschedule`` after a reload; ``stop`` it, letting a round in
    progress finish. ``reports`` is the weekly report's job (None: no report is made)."""

    def __init__(self, shared: Shared, rounds: Rounds, intake: Intake, reports: WeeklyReports | None) -> None:
        self.shared = shared
        self.rounds = rounds
        self.intake = intake
        self.reports = reports
        self.scheduler: AsyncIOScheduler | None = None
        self._scrapes: set[asyncio.Task[Any]] = set()  # scrapes in progress

    # --- scheduling ------------------------------------------------------------------------------

    def start(self) -> None:
        self.scheduler = AsyncIOScheduler(
            timezone="UTC",
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.scheduler.add_listener(self._on_overrun, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self._schedule_jobs()
        self.scheduler.start()

    def reschedule(self) -> None:
        """The jobs anew for the config as it is now (a reload); nothing before the start."""
        if self.scheduler is not None:
            self._schedule_jobs()

    def _schedule_jobs(self) -> None:
        assert self.scheduler is not None
        shared = self.shared
        for job in self.scheduler.get_jobs():
            job.remove()
        now = datetime.now(UTC)
        if shared.loaded.config.sources.kind == "scrape":
            every = scrape_every(shared.loaded)
            self.scheduler.add_job(
                self._refresh, IntervalTrigger(seconds=every), id="scrape", next_run_time=now
            )
        self.scheduler.add_job(
            self.intake.prune, IntervalTrigger(hours=1), id="prune-alerts", next_run_time=now
        )
        config = shared.loaded.config
        if config.history.enabled:
            self.scheduler.add_job(
                self._prune_history, IntervalTrigger(hours=1), id="prune-history", next_run_time=now
            )
            if shared.history_source is not None:
                self.scheduler.add_job(
                    self._scrape_history,
                    IntervalTrigger(seconds=HISTORY_SCRAPE_EVERY),
                    id="scrape-history",
                    next_run_time=now,
                )
        if config.report.schedule is not None and self.reports is not None:
            # Only the time of day counts: a run the daemon missed is made once, at start.
            self.scheduler.add_job(
                self.weekly_report,
                cron(config.report.schedule, config.report.timezone),
                id="report",
                misfire_grace_time=3600,
            )
        intervals = sorted({self.rounds.interval_of(r) for r in shared.loaded.enabled_rules()})
        shared.last_round_of = {interval: shared.last_round_of.get(interval) for interval in intervals}
        for interval in intervals:
            self.scheduler.add_job(
                self.rounds.evaluate_round,
                IntervalTrigger(seconds=interval),
                args=[interval],
                id=f"evaluate-{format_duration(interval)}",
                next_run_time=now,
            )

    def _on_overrun(self, event: JobExecutionEvent) -> None:
        self.shared.overruns.skipped(event.job_id)  # counted; a late round logged once per episode

    async def stop(self, grace: float) -> None:
        """No new rounds; a scrape in flight is abandoned; a round in progress (or a batch of
        alerts) gets ``grace`` seconds to finish its actions."""
        if self.scheduler is None:
            return
        self.scheduler.pause()  # no new rounds; the one in progress may finish its actions
        for scrape in list(self._scrapes):  # a scrape in flight is simply abandoned
            scrape.cancel()
        if self._scrapes:
            await asyncio.wait(set(self._scrapes), timeout=5)
        if self.shared.busy:
            _, unfinished = await asyncio.wait(set(self.shared.busy), timeout=grace)
            if unfinished:
                log.warning("stopped mid-round: unfinished action runs resume at the next start")
        self.scheduler.shutdown(wait=False)

    async def _refresh(self) -> None:
        shared = self.shared
        task = asyncio.current_task()
        assert task is not None
        self._scrapes.add(task)
        try:
            await shared.source.refresh()
        except asyncio.CancelledError:
            return  # stopping: the scrape is abandoned, nothing to report
        finally:
            self._scrapes.discard(task)
        await self.record_history(shared.source)
        errors: Mapping[str, str] = getattr(shared.source, "last_errors", {})
        instances: Mapping[str, str] = getattr(shared.source, "instances", {})
        for target in errors:
            shared.metrics.source_errors.labels(shared.source.kind, instances.get(target, "")).inc()

    # --- history and reports ---------------------------------------------------------------------

    async def record_history(self, source: Any) -> None:
        latest = getattr(source, "latest", None)
        if latest is None or not self.shared.loaded.config.history.enabled:
            return
        scrapes = latest()
        try:
            # Unsynced: a power cut may lose the last few scrapes' increases, which the next
            # scrape after the restart then counts (it is compared with the last one stored).
            await self.shared.store.call(lambda db: history.record(db, scrapes), synced=False)
        except StoreError as exc:
            # The store's trouble (a full disk), said once with the evaluations'; the scrapes not
            # recorded are counted by the next one that is (it compares with the last one stored).
            self.shared.store_failed(str(exc))

    async def _scrape_history(self) -> None:
        await self.shared.history_source.refresh()
        await self.record_history(self.shared.history_source)

    async def _prune_history(self) -> None:
        config = self.shared.loaded.config.history
        before = time.time() - config.retention
        try:
            await self.shared.store.call(lambda db: history.prune(db, before, config.max_size), synced=False)
        except StoreError as exc:
            self.shared.store_failed(str(exc))

    async def weekly_report(self, scheduled: float | None = None) -> None:
        """The report of the period from the schedule's previous time to ``scheduled`` (the
        schedule's time now, by default); posted to Slack when the config names a slack action."""
        weekly = self.reports
        if weekly is None:
            return
        shared = self.shared
        config = shared.loaded.config
        job = self.scheduler.get_job("report") if self.scheduler is not None else None
        trigger = (
            job.trigger if job is not None else cron(config.report.schedule or "", config.report.timezone)
        )
        if scheduled is None:
            moment = last_due(trigger, datetime.fromtimestamp(time.time() - 86400, UTC), datetime.now(UTC))
            if moment is None:
                return
            scheduled = moment.timestamp()
        slack = config.report.slack

        async def deliver(report: dict[str, Any]) -> None:
            assert slack is not None
            said = await weekly.post(
                shared.store, shared.dispatcher.actions, slack, report, config.reports_dir()
            )
            log.info("weekly report for Slack: %s", said)
            shared.dispatcher.wake()

        try:
            await weekly.scheduled_report(
                shared.store, trigger, scheduled, config.report.period, config.report.formats,
                config.reports_dir(), shared.loaded.baseline, deliver if slack is not None else None,
                remedies=[name for name, action in shared.dispatcher.actions.items() if action.changes_world],
                routing=config.routing,
            )  # fmt: skip
        except Exception:  # a report must never take the daemon down: said, and tried next time
            log.exception("the weekly report of %s failed", datetime.fromtimestamp(scheduled, UTC).date())

    async def catch_up_report(self) -> None:
        """Make the last report the daemon missed while it was down, once."""
        weekly = self.reports
        config = self.shared.loaded.config
        if weekly is None or config.report.schedule is None:
            return
        try:
            due = await weekly.missed(
                self.shared.store,
                cron(config.report.schedule, config.report.timezone),
                time.time(),
                config.history.retention,
            )
        except StoreError as exc:
            self.shared.store_failed(str(exc))
            return
        if due is not None:
            log.info(
                "the weekly report of %s was missed while stopped: made now", datetime.fromtimestamp(due, UTC)
            )
            await self.weekly_report(due)
