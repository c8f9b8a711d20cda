"""The running daemon: wires config, source, engine, store, dispatcher, scheduler and HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from specguard import __version__
from specguard.common.schedule import cron, last_due
from specguard.config.loading import Loaded, LoadedRule, load
from specguard.config.schema import Config
from specguard.daemon import overview, page, systemd
from specguard.daemon.alertmanager.book import AlertBook, Receipt, trigger_of
from specguard.daemon.alertmanager.inbox import RECEIPT_RETENTION, Inbox, Stored
from specguard.daemon.alertmanager.payload import Message
from specguard.daemon.alertmanager.receiver import make_handler
from specguard.daemon.evaluation import evaluate_rule, window_of
from specguard.daemon.overruns import Overruns
from specguard.daemon.reports import WeeklyReports
from specguard.daemon.server import Webhook, start_server
from specguard.daemon.status import health as health_of
from specguard.daemon.status import rule_rows, status_line
from specguard.dispatch import Dispatcher, ladder, silences
from specguard.engine.states import Outcome
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.durations import format_duration
from specguard.rules.matchers import all_match
from specguard.sources.base import Source, SourceResult
from specguard.store import history
from specguard.store.database import Store, StoreError
from specguard.store.records import SCHEDULE, EventRecord, SeriesState, State, Verdict

log = logging.getLogger("specguard")

STORE_FILE = "specguard.db"
SWITCH_INTERVAL = 0.001  # seconds (CPython's default: 0.005)
# Alert states acted on in one step (one evaluation and one commit per rule they concern).
ALERT_BATCH = 256
# How long a stop waits for a round in progress (its action runs) to finish; below systemd's
# TimeoutStopSec. What is cut off is still in the store and runs at the next start.
SHUTDOWN_GRACE = 20.0


def make_source(loaded: Loaded) -> Source:
    """The configured source. Prometheus is imported only when it is used."""
    config, retention = loaded.config, retention_for(loaded)
    if config.sources.prometheus is not None:
        from specguard.sources.prometheus import PrometheusSource

        p = config.sources.prometheus
        return PrometheusSource(
            p.url, p.timeout, bearer_token=loaded.prometheus_token, verify_tls=p.verify_tls
        )
    from specguard.sources.scrape import ScrapeSource

    scrape = config.scrape
    return ScrapeSource(
        scrape.urls,
        timeout=scrape.timeout,
        retention=retention,
        names=scrape.names,
        max_page_bytes=scrape.max_page_size,
    )


HISTORY_SCRAPE_EVERY = 15.0  # seconds, for history_source


def make_history_source(config: Config) -> Any:
    """The scrape of ``history.scrape`` when the Prometheus source leaves history without samples."""
    if config.sources.prometheus is None or config.history.scrape is None or not config.history.enabled:
        return None
    from specguard.sources.scrape import ScrapeSource

    scrape = config.history.scrape
    return ScrapeSource(
        scrape.urls, timeout=scrape.timeout, retention=4 * HISTORY_SCRAPE_EVERY, names=scrape.names,
        max_page_bytes=scrape.max_page_size,
    )  # fmt: skip


def _windows(loaded: Loaded) -> list[float]:
    """The window each enabled rule reads (a detector's is its interval)."""
    return [window_of(r, loaded.config.interval) for r in loaded.enabled_rules()] or [300.0]


def retention_for(loaded: Loaded) -> float:
    """How long the scrape source must keep samples: the longest window, plus slack."""
    return max(_windows(loaded)) + 2 * loaded.config.interval + 30


def scrape_every(loaded: Loaded) -> float:
    """Scrape often enough that every window holds several samples."""
    return max(1.0, min(loaded.config.interval, min(_windows(loaded)) / 4))


class Daemon:
    def __init__(
        self,
        loaded: Loaded,
        config_file: Path | None = None,
        rule_files: Sequence[str] = (),
        overrides: Mapping[str, Any] | None = None,
        reports: WeeklyReports | None = None,
    ):
        self.loaded = loaded
        self.reports = reports  # the weekly report's job; None: no report is made
        self.config_file = config_file
        self.rule_files = list(rule_files)
        self.overrides = dict(overrides or {})
        self.metrics = DaemonMetrics()
        self.overruns = Overruns(self.metrics)
        self.metrics.show_baseline(loaded.baseline)
        self.metrics.show_rules(r.name for r in loaded.enabled_rules())
        self.store = Store(loaded.config.resolved_state_dir() / STORE_FILE)
        self.source: Source = make_source(loaded)
        # With the Prometheus source, the servers whose history is kept are scraped for it alone.
        self.history_source: Any = make_history_source(loaded.config)
        self.dispatcher = Dispatcher(
            self.store, loaded.actions, loaded.config.dry_run, self.metrics, rules=loaded.rules
        )
        # What Alertmanager has said, alert by alert, of the alerts some rule watches: the others
        # are only stored (a reload that adds a rule reads them back from the store).
        self.alerts = AlertBook()
        self._rebuilding: list[Receipt] | None = None  # receipts taken in while the book is rebuilt
        self.inbox = Inbox(self.store, self._acted_on)
        self._alert_queue: asyncio.Queue[list[Receipt]] = asyncio.Queue()
        self._rule_locks: dict[str, asyncio.Lock] = {}  # one evaluation of a rule at a time
        self._connections_peak = 0  # the most connections the HTTP server held at once
        self.states: dict[str, dict[str, SeriesState]] = {}
        self.rule_errors: dict[str, str | None] = {}
        self.scheduler: AsyncIOScheduler | None = None
        self.started_at = time.time()
        self.last_round: float | None = None
        self.last_round_of: dict[float, float | None] = {}  # interval -> when its last round finished
        self._first_rounds = asyncio.Event()  # every rule evaluated once since the start: READY=1
        self._unevaluated: set[str] = set()  # rules not yet evaluated since the start
        self._status_told: str | None = None  # the last STATUS= sent
        self.notifier = systemd.Notifier()
        self._reload_after_start = False  # a SIGHUP came before READY=1: reload once ready
        self.store_error: str | None = None  # why the store cannot be written, while it cannot
        self.rule_verdicts: dict[str, tuple[str, str | None]] = {}  # rule -> (verdict, why) without series
        self._scrapes: set[asyncio.Task[Any]] = set()  # scrapes in progress
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._rounds: set[asyncio.Task[Any]] = set()  # evaluation rounds in progress
        self._site_runner: Any = None
        self.port: int | None = None
        # Called with each recorded event after it is stored: how an embedding program (the demo)
        # follows what the daemon decides.
        self.on_event: list[Callable[[LoadedRule, EventRecord], None]] = []

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self, handle_signals: bool = True) -> None:
        """Open the store, resume unfinished runs, start the server and the schedule.

        ``handle_signals=False`` leaves SIGTERM/SIGINT/SIGHUP to an embedding program.
        """
        # The writer thread hands each stored batch back to the event loop; with CPython's default
        # 5 ms GIL switch interval a webhook answer could wait that long behind Python work on the
        # other thread. 1 ms keeps answers prompt at a cost too small to measure here.
        sys.setswitchinterval(SWITCH_INTERVAL)
        try:
            await self.store.open()
        except StoreError as exc:
            raise SystemExit(f"specguard: {exc}") from None
        # A disabled rule's series are forgotten as a removed rule's are: enabled again, it starts
        # from inactive, as a Prometheus alerting rule does, and a breach then is a new incident.
        configured = {r.name for r in self.loaded.rules if r.rule.enabled}
        dropped = await self.store.forget_rules(configured)
        if dropped:
            log.info("forgot the state of %d rule(s) no longer configured or disabled", dropped)
        self.states = await self.store.load_states()
        firing = sum(1 for s in self._all_series() if s.state is State.FIRING)
        log.info(
            "state loaded from %s: %d series, %d firing",
            self.store.path,
            sum(len(v) for v in self.states.values()),
            firing,
        )
        await self.dispatcher.run()  # runs left unfinished by the previous process
        self.alerts.load(r for r in await self.inbox.known() if self._watched(r.labels))
        unprocessed = await self.inbox.unprocessed()  # stored, then the process stopped
        if unprocessed:
            log.info("%d alert(s) received before the last stop are acted on now", len(unprocessed))
            self._alert_queue.put_nowait(unprocessed)
        config = self.loaded.config
        server = config.server
        webhook = Webhook(
            server.webhook_path,
            make_handler(self, lambda: self.loaded.webhook_token, server.webhook_max_body_size, self.metrics),
            server.webhook_max_body_size,
        )
        api = [
            *silences.api_routes(
                self.store.call,
                lambda: self.loaded.webhook_token,
                lambda: self.loaded.config.server.max_silence,
            ),
            *ladder.api_routes(
                lambda: self.dispatcher.actions, self.store, lambda: self.loaded.webhook_token
            ),
            *page.routes(self.overview, self.store.call, lambda: self.loaded.webhook_token),
        ]
        self._site_runner, self.port = await start_server(
            self, config.listen, config.port, webhook=webhook, routes=api
        )
        if self.loaded.webhook_token is None:
            log.info(
                "the Alertmanager webhook at %s takes deliveries without a token (loopback only)",
                server.webhook_path,
            )
        self._spawn(self._process_alerts())
        self._spawn(self.dispatcher.serve())  # restores, when their quiet period is over
        if handle_signals:
            self._install_signal_handlers()
        wd = systemd.watchdog_interval()
        if wd:
            self._spawn(self.notifier.watchdog(wd))
        self._unevaluated = {item.name for item in self.loaded.enabled_rules()}
        if not self._unevaluated:
            self._first_rounds.set()
        self._start_scheduler()
        self._spawn(self._catch_up_report())
        # Ready means serving and judging: the HTTP server listens (above) and every rule has been
        # evaluated once and its states stored, so what /api/status shows is real. A rule's
        # actions run beside the rounds: a slow one holds back neither the first round nor READY.
        # A stop asked for meanwhile (SIGTERM during the first round) ends the wait.
        waits = [asyncio.ensure_future(event.wait()) for event in (self._first_rounds, self._stop)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if self._stop.is_set():
            return
        self._status_told = self._status_line()
        self.notifier.ready(self._status_told)
        log.info(
            "specguard running: %d rules, source %s, http://%s:%s, dry_run=%s",
            len(self.loaded.enabled_rules()),
            self.loaded.config.sources.kind,
            self.loaded.config.listen,
            self.port,
            self.loaded.config.dry_run,
        )
        if self._reload_after_start:
            self._reload_after_start = False
            self._spawn(self.reload())

    async def run_until_stopped(self) -> None:
        await self.start()
        try:
            await self._stop.wait()
        finally:
            await self.shutdown()

    def request_stop(self) -> None:
        self._stop.set()

    async def shutdown(self) -> None:
        # First, so that nothing a reload or a round in progress finishes says "running" after it.
        self.notifier.stopping()
        log.info("stopping")
        if self.scheduler is not None:
            self.scheduler.pause()  # no new rounds; the one in progress may finish its actions
            for scrape in list(self._scrapes):  # a scrape in flight is simply abandoned
                scrape.cancel()
            if self._scrapes:
                await asyncio.wait(set(self._scrapes), timeout=5)
            if self._rounds:
                _, unfinished = await asyncio.wait(set(self._rounds), timeout=SHUTDOWN_GRACE)
                if unfinished:
                    log.warning("stopped mid-round: unfinished action runs resume at the next start")
            self.scheduler.shutdown(wait=False)
        await self.dispatcher.quiesce(SHUTDOWN_GRACE)  # a run it started finishes, as a round's does
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.dispatcher.stop()  # a restart under way is resumed from its journal next time
        if self._site_runner is not None:
            await self._site_runner.cleanup()
        await self.source.close()
        if self.history_source is not None:
            await self.history_source.close()
        await self.store.close()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)

    def _hangup(self) -> None:
        if self._stop.is_set() or self.notifier.is_stopping:
            log.info("reload ignored: stopping")  # the store and the source are being closed
            return
        if self.notifier.is_ready:
            self._spawn(self.reload())
            return
        # systemd still waits for the first READY=1, which only the end of the first round may
        # send: a reload now could neither say RELOADING=1 nor end with READY=1, and it would change
        # the rules the first round is counting. It runs once the daemon is ready.
        if not self._reload_after_start:
            log.info("reload asked for during start-up: it runs once every rule has been evaluated")
        self._reload_after_start = True

    # --- scheduling ------------------------------------------------------------------------------

    def _interval_of(self, item: LoadedRule) -> float:
        return item.rule.interval or self.loaded.config.interval

    def _start_scheduler(self) -> None:
        self.scheduler = AsyncIOScheduler(
            timezone="UTC",
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.scheduler.add_listener(self._on_overrun, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self._schedule_jobs()
        self.scheduler.start()

    def _schedule_jobs(self) -> None:
        assert self.scheduler is not None
        for job in self.scheduler.get_jobs():
            job.remove()
        now = datetime.now(UTC)
        if self.loaded.config.sources.kind == "scrape":
            every = scrape_every(self.loaded)
            self.scheduler.add_job(
                self._refresh, IntervalTrigger(seconds=every), id="scrape", next_run_time=now
            )
        self.scheduler.add_job(
            self._prune_alerts, IntervalTrigger(hours=1), id="prune-alerts", next_run_time=now
        )
        config = self.loaded.config
        if config.history.enabled:
            self.scheduler.add_job(
                self._prune_history, IntervalTrigger(hours=1), id="prune-history", next_run_time=now
            )
            if self.history_source is not None:
                self.scheduler.add_job(
                    self._scrape_history,
                    IntervalTrigger(seconds=HISTORY_SCRAPE_EVERY),
                    id="scrape-history",
                    next_run_time=now,
                )
        if config.report.schedule is not None and self.reports is not None:
            # Only the time of day counts: a run the daemon missed is made once, at start.
            self.scheduler.add_job(
                self._weekly_report,
                cron(config.report.schedule, config.report.timezone),
                id="report",
                misfire_grace_time=3600,
            )
        intervals = sorted({self._interval_of(r) for r in self.loaded.enabled_rules()})
        self.last_round_of = {interval: self.last_round_of.get(interval) for interval in intervals}
        for interval in intervals:
            self.scheduler.add_job(
                self.evaluate_round,
                IntervalTrigger(seconds=interval),
                args=[interval],
                id=f"evaluate-{format_duration(interval)}",
                next_run_time=now,
            )

    def _on_overrun(self, event: JobExecutionEvent) -> None:
        self.overruns.skipped(event.job_id)  # counted; a late round logged once per episode

    async def _refresh(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._scrapes.add(task)
        try:
            await self.source.refresh()
        except asyncio.CancelledError:
            return  # stopping: the scrape is abandoned, nothing to report
        finally:
            self._scrapes.discard(task)
        await self._record_history(self.source)
        errors: Mapping[str, str] = getattr(self.source, "last_errors", {})
        instances: Mapping[str, str] = getattr(self.source, "instances", {})
        for target in errors:
            self.metrics.source_errors.labels(self.source.kind, instances.get(target, "")).inc()

    # --- history and reports ---------------------------------------------------------------------

    async def _record_history(self, source: Any) -> None:
        latest = getattr(source, "latest", None)
        if latest is None or not self.loaded.config.history.enabled:
            return
        scrapes = latest()
        try:
            # Unsynced: a power cut may lose the last few scrapes' increases, which the next
            # scrape after the restart then counts (it is compared with the last one stored).
            await self.store.call(lambda db: history.record(db, scrapes), synced=False)
        except StoreError as exc:
            # The store's trouble (a full disk), said once with the evaluations'; the scrapes not
            # recorded are counted by the next one that is (it compares with the last one stored).
            self._store_failed(str(exc))

    async def _scrape_history(self) -> None:
        await self.history_source.refresh()
        await self._record_history(self.history_source)

    async def _prune_history(self) -> None:
        config = self.loaded.config.history
        before = time.time() - config.retention
        try:
            await self.store.call(lambda db: history.prune(db, before, config.max_size), synced=False)
        except StoreError as exc:
            self._store_failed(str(exc))

    async def _weekly_report(self, scheduled: float | None = None) -> None:
        """The report of the period from the schedule's previous time to ``scheduled`` (the
        schedule's time now, by default); posted to Slack when the config names a slack action."""
        weekly = self.reports
        if weekly is None:
            return
        config = self.loaded.config
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
            said = await weekly.post(self.store, self.dispatcher.actions, slack, report, config.reports_dir())
            log.info("weekly report for Slack: %s", said)
            self.dispatcher.wake()

        try:
            await weekly.scheduled_report(
                self.store, trigger, scheduled, config.report.period, config.report.formats,
                config.reports_dir(), self.loaded.baseline, deliver if slack is not None else None,
                remedies=[name for name, action in self.dispatcher.actions.items() if action.changes_world],
            )  # fmt: skip
        except Exception:  # a report must never take the daemon down: said, and tried next time
            log.exception("the weekly report of %s failed", datetime.fromtimestamp(scheduled, UTC).date())

    async def _catch_up_report(self) -> None:
        """Make the last report the daemon missed while it was down, once."""
        weekly = self.reports
        config = self.loaded.config
        if weekly is None or config.report.schedule is None:
            return
        try:
            due = await weekly.missed(
                self.store,
                cron(config.report.schedule, config.report.timezone),
                time.time(),
                config.history.retention,
            )
        except StoreError as exc:
            self._store_failed(str(exc))
            return
        if due is not None:
            log.info(
                "the weekly report of %s was missed while stopped: made now", datetime.fromtimestamp(due, UTC)
            )
            await self._weekly_report(due)

    # --- evaluation ------------------------------------------------------------------------------

    async def evaluate_round(self, interval: float | None = None) -> None:
        """Evaluate the enabled rules of one interval (all of them when ``interval`` is None)."""
        task = asyncio.current_task()
        assert task is not None
        self._rounds.add(task)
        try:
            await self._round(interval)
        except asyncio.CancelledError:
            # The stop waited its grace period for this round and cut it off: what it had not
            # stored is found again at the next start. Said once, by the stop.
            return
        finally:
            self._rounds.discard(task)

    async def _round(self, interval: float | None) -> None:
        started = time.monotonic()
        rules = [
            r for r in self.loaded.enabled_rules() if interval is None or self._interval_of(r) == interval
        ]
        if self.store_error is not None:
            await self._retry_store()
        for item in rules:
            try:
                await self._evaluate_one(item)
            except StoreError as exc:
                self._store_failed(str(exc))
            except Exception as exc:  # one rule's failure must not stop the others
                log.exception("rule %s: evaluation failed", item.name)
                self.metrics.evaluations.labels(item.name, Verdict.ERROR.value).inc()
                self._note_error(item.name, f"evaluation failed: {type(exc).__name__}: {exc}")
            finally:
                self._evaluated(item.name)  # a failed evaluation is a verdict too: it must not hold READY
        label = format_duration(interval) if interval else "all"
        self.metrics.evaluation_duration.labels(label).observe(took := time.monotonic() - started)
        self.overruns.ran(label, took, interval)
        self.last_round = time.time()
        for each in [interval] if interval is not None else list(self.last_round_of):
            self.last_round_of[each] = self.last_round
        self.metrics.last_evaluation.set(self.last_round)
        self._tell_status()
        self.dispatcher.wake()  # the flags are looked at against the states this round left

    def _evaluated(self, name: str) -> None:
        """Rule ``name`` has been evaluated (stored, or failed) since the start: READY=1 once all have."""
        self._unevaluated.discard(name)
        if not self._unevaluated:
            self._first_rounds.set()

    def _status_line(self) -> str:
        targets: Any = getattr(self.source, "target_health", None)
        return status_line(self.rule_rows(), targets() if targets is not None else [], self.store_error)

    def _tell_status(self) -> None:
        """systemd's STATUS=, when it says something new."""
        line = self._status_line()
        if line != self._status_told:
            self._status_told = line
            self.notifier.status(line)

    async def _evaluate_one(
        self, item: LoadedRule, trigger: str = SCHEDULE, touched: Sequence[Receipt] | None = None
    ) -> None:
        # The schedule and a webhook delivery may both want the rule: one after the other, each
        # on the states the other left.
        lock = self._rule_locks.setdefault(item.name, asyncio.Lock())
        async with lock:
            await self._evaluate_locked(item, time.time(), trigger, touched)

    async def _evaluate_locked(
        self, item: LoadedRule, now: float, trigger: str, touched: Sequence[Receipt] | None = None
    ) -> None:
        name = item.name
        previous = self.states.get(name, {})
        partial = item.rule.alert_only  # an alert rule evaluates the series that can change
        outcome, result = await evaluate_rule(
            item,
            self.source,
            self.loaded.baseline,
            previous,
            now,
            self._interval_of(item),
            alerts=self.alerts,
            trigger=trigger,
            touched=touched,
        )
        for key in outcome.forgotten:
            old = previous.get(key)
            log.info(
                "%s: forgot series %s: no data for %s",
                name,
                key,
                format_duration(now - (old.last_seen or old.last_eval or now)) if old else "long",
                extra={"rule": name, "labels": dict(old.labels) if old else {}},
            )
        if result.error is not None:
            self.metrics.source_errors.labels(self.source.kind, "").inc()
        records = [self.dispatcher.record(item, event) for event in outcome.events]
        # Nothing is decided until it is stored: if the store cannot be written, the states stay as
        # they were and the same transitions are found again once it can.
        if partial:
            pending = await self.store.commit_series(
                name, outcome.states, outcome.forgotten, records, self.dispatcher.guard
            )
            states = {**previous, **outcome.states}
            for key in outcome.forgotten:
                states.pop(key, None)
        else:
            pending = await self.store.commit_evaluation(name, outcome.states, records, self.dispatcher.guard)
            states = outcome.states
        self.states[name] = states
        self.rule_verdicts[name] = _rule_verdict(outcome, result)
        self._evaluated(name)  # before its actions run: they must not hold READY
        self._note_error(name, outcome.error)
        verdicts = list(outcome.verdicts.values()) or [Verdict.ERROR if outcome.error else Verdict.NO_DATA]
        for verdict in verdicts:
            self.metrics.evaluations.labels(name, verdict.value).inc()
        counts = dict.fromkeys(State, 0)
        for series in states.values():
            counts[series.state] += 1
        for state, count in counts.items():
            self.metrics.rule_series.labels(name, state.value).set(count)
        for record in records:
            event = record.event
            for observer in self.on_event:
                observer(item, record)
            self.metrics.events.labels(name, event.kind.value).inc()
            log.info(
                "%s: %s -> %s: %s%s",
                name,
                event.previous.value,
                event.kind.value,
                record.summary,
                "" if event.trigger == SCHEDULE else f" [{event.trigger}]",
                extra={
                    "rule": name,
                    "labels": dict(event.labels),
                    "value": event.value,
                    "trigger": event.trigger,
                },
            )
        if records:  # runs to carry out, and runs the guards held back to log
            await self.dispatcher.run(pending, wait=False)  # carried out beside the round

    # --- Alertmanager ----------------------------------------------------------------------------

    async def deliver(self, message: Message, received: float) -> Stored:
        """A webhook delivery: stored (the answer waits for this), then acted on in order."""
        stored = await self.inbox.put(message, received)
        for receipt in stored.new:
            if receipt not in stored.to_act_on and self._watched(receipt.labels):
                self._book(receipt)  # a rule reads it, but this status does not trigger it
        if stored.to_act_on:
            self._alert_queue.put_nowait(list(stored.to_act_on))
        return stored

    def _watched(self, labels: Mapping[str, str]) -> bool:
        """Whether some rule's ``alert.match`` takes an alert with ``labels`` (whatever its status)."""
        return any(
            item.rule.alert is not None and all_match(item.rule.alert.matchers, labels)
            for item in self.loaded.enabled_rules()
        )

    def _book(self, receipt: Receipt) -> None:
        self.alerts.update(receipt)
        if self._rebuilding is not None:
            self._rebuilding.append(receipt)

    async def _rebuild_book(self) -> None:
        """The alert book anew from the store, for the rules as they are now (after a reload).
        Receipts taken in meanwhile are applied again to the new book: the store had them too, or
        was about to."""
        self._rebuilding = []
        try:
            book = AlertBook()
            book.load(r for r in await self.inbox.known() if self._watched(r.labels))
            book.load(r for r in self._rebuilding if self._watched(r.labels))  # stale ones are ignored
            self.alerts = book
        finally:
            self._rebuilding = None

    def _acted_on(self, labels: Mapping[str, str], status: str) -> bool:
        """Whether an alert with ``labels`` and ``status`` moves or triggers some rule now."""
        return any(item.rule.takes_alert(labels, status) for item in self.loaded.enabled_rules())

    async def _process_alerts(self) -> None:
        """Alert states in the order they were stored: the alert book learns them, then every rule
        they concern is evaluated at once, and they are marked done."""
        waiting: list[Receipt] = []
        while True:
            if not waiting:
                waiting = await self._alert_queue.get()
            while not self._alert_queue.empty():
                waiting.extend(self._alert_queue.get_nowait())
            # A bounded batch: a backlog is worked off in steps, each one transaction, between
            # which deliveries keep being stored (they wait for the same writer thread).
            receipts, waiting = waiting[:ALERT_BATCH], waiting[ALERT_BATCH:]
            # One task per batch, counted as a round: a stop lets it finish as it lets a round
            # finish (the loop itself waits forever, and is simply cancelled).
            task = asyncio.get_running_loop().create_task(self._act_on_alerts(receipts))
            self._rounds.add(task)
            try:
                await task
            finally:
                self._rounds.discard(task)

    async def _act_on_alerts(self, receipts: list[Receipt]) -> None:
        for receipt in receipts:
            self._book(receipt)
        for item in self.loaded.enabled_rules():
            concerned = [r for r in receipts if item.rule.takes_alert(r.labels, r.status)]
            if not concerned:
                continue
            try:
                await self._evaluate_one(item, _alert_trigger(concerned), concerned)
            except StoreError as exc:
                self._store_failed(str(exc))
                # Left unmarked: the schedule takes these alerts up once the store can be written
                # (their series disagree with their states), and the next start acts on them.
                return
            except Exception as exc:
                log.exception("rule %s: evaluation on an Alertmanager delivery failed", item.name)
                self._note_error(item.name, f"evaluation failed: {type(exc).__name__}: {exc}")
        try:
            await self.inbox.mark_processed([r.id for r in receipts], time.time())
        except StoreError as exc:
            self._store_failed(str(exc))

    async def _prune_alerts(self) -> None:
        now = time.time()
        self.alerts.prune(now)
        try:
            removed = await self.inbox.prune(now - RECEIPT_RETENTION)
        except StoreError as exc:
            self._store_failed(str(exc))
            return
        if removed:
            log.info("dropped %d alert receipts older than %s", removed, format_duration(RECEIPT_RETENTION))

    def _store_failed(self, message: str) -> None:
        self.metrics.store_errors.inc()
        if message != self.store_error:  # once per change, not once per rule and round
            log.error("%s: rules are evaluated but nothing changes until it can be written", message)
        self.store_error = message

    async def _retry_store(self) -> None:
        """Once the store failed, only a real write says it works again: a rule with nothing to
        change commits nothing, and succeeds even on a full disk."""
        try:
            await self.store.check_writable()
        except StoreError as exc:
            self._store_failed(str(exc))
            return
        log.info("the state store can be written again: %s", self.store.path)
        self.store_error = None
        try:
            await self.dispatcher.run(wait=False)  # runs recorded before the store failed, still to do
        except StoreError as exc:
            self._store_failed(str(exc))

    def _note_error(self, rule: str, error: str | None) -> None:
        if error != self.rule_errors.get(rule):
            if error:
                log.warning("rule %s: %s", rule, error)
            elif self.rule_errors.get(rule):
                log.info("rule %s: evaluating again", rule)
        self.rule_errors[rule] = error

    def _all_series(self) -> list[SeriesState]:
        return [s for states in self.states.values() for s in states.values()]

    # --- reload ----------------------------------------------------------------------------------

    async def reload(self) -> bool:
        """Re-read the config (SIGHUP). An invalid new config leaves the running one in place."""
        self.notifier.reloading()
        try:
            new = await asyncio.to_thread(load, self.config_file, self.rule_files, self.overrides)
            if not new.ok:
                self.metrics.config_reloads.labels("failed").inc()
                for problem in new.errors:
                    log.error("reload: %s", problem)
                log.error(
                    "reload failed: keeping the running configuration (%d problems)",
                    len(new.errors),
                )
                return False
            old = self.loaded
            if (old.config.listen, old.config.port) != (new.config.listen, new.config.port):
                log.warning("reload: listen address changes take effect after a restart")
            if old.config.resolved_state_dir() != new.config.resolved_state_dir():
                log.warning("reload: state_dir changes take effect after a restart")
            if (old.config.server.webhook_path, old.config.server.webhook_max_body_size) != (
                new.config.server.webhook_path,
                new.config.server.webhook_max_body_size,
            ):
                log.warning(
                    "reload: webhook_path and webhook_max_body_size changes take effect after a restart"
                )
            if (
                old.config.sources != new.config.sources
                or old.prometheus_token != new.prometheus_token
                or retention_for(old) != retention_for(new)
            ):
                source = make_source(new)
                adopt = getattr(source, "adopt", None)
                if adopt is not None and type(source) is type(self.source):
                    adopt(self.source)  # targets kept across the reload keep their samples
                await self.source.close()
                self.source = source
            if (old.config.sources, old.config.history) != (new.config.sources, new.config.history):
                if self.history_source is not None:
                    await self.history_source.close()
                self.history_source = make_history_source(new.config)
            self.loaded = new
            self.metrics.show_baseline(new.baseline)
            self.metrics.show_rules(r.name for r in new.enabled_rules())
            await self._rebuild_book()
            await self._warn_of_flags_left(old, new)
            self.dispatcher.actions = dict(new.actions)
            self.dispatcher.set_rules(new.rules)
            self.dispatcher.dry_run = new.config.dry_run
            configured = {r.name for r in new.rules if r.rule.enabled}  # as at start
            for name in list(self.states):
                if name not in configured:
                    del self.states[name]
            await self.store.forget_rules(configured)
            self.dispatcher.wake()  # a flag held by a rule now gone, disabled or changed is let go
            if self.scheduler is not None:
                self._schedule_jobs()
            self.metrics.config_reloads.labels("ok").inc()
            log.info("reloaded: %d rules", len(new.enabled_rules()))
            return True
        finally:
            self._status_told = self._status_line()
            self.notifier.reloaded(self._status_told)

    async def _warn_of_flags_left(self, old: Loaded, new: Loaded) -> None:
        """A feature flag the reload removes is left as it is: said when it may be engaged."""
        for name, action in old.actions.items():
            if action.reconciled and name not in new.actions:
                record = await self.store.memory_read(name, "flag") or {}
                if record.get("state", "engaged" if record.get("engaged") else "restored") != "restored":
                    log.warning(
                        "reload: the feature_flag action %s is gone while its flag may be engaged: it is left "
                        "as it is; restore it by hand, or put the action back until it is restored",
                        name,
                    )

    # --- status ----------------------------------------------------------------------------------

    @property
    def registry(self) -> Any:
        return self.metrics.registry

    def health(self) -> tuple[bool, dict[str, Any]]:
        healthy, body = health_of(
            self.last_round_of, self.started_at, time.time(), len(self.loaded.enabled_rules())
        )
        if self.store_error is not None:
            body["status"] = "store_failing"
            body["reason"] = "; ".join(r for r in (body.get("reason"), self.store_error) if r)
            return False, body
        return healthy, body

    def connections_held(self, count: int) -> None:
        """The HTTP server holds ``count`` connections now (after closing any beyond its cap)."""
        if count > self._connections_peak:
            self._connections_peak = count
            self.metrics.connections_peak.set(count)

    def connections_evicted(self) -> None:
        """The HTTP server closed an old connection to make room (a flood, or many idle clients)."""
        self.metrics.connections_evicted.inc()

    def warming_up(self) -> list[str]:
        warming: Any = getattr(self.source, "warming_up", None)
        return sorted(warming()) if warming is not None else []

    def status(self) -> dict[str, Any]:
        targets: Any = getattr(self.source, "target_health", None)
        return {
            "version": __version__,
            "source": self.loaded.config.sources.kind,
            "sources": {
                "warming_up": self.warming_up(),
                "targets": targets() if targets is not None else [],
            },
            "store": {"path": str(self.store.path), "error": self.store_error},
            "webhook": {
                "path": self.loaded.config.server.webhook_path,
                "authenticated": self.loaded.webhook_token is not None,
                "watched_alerts": self.alerts.counts(),  # alerts some rule watches, by status
            },
            "dry_run": self.loaded.config.dry_run,
            "last_evaluation": self.last_round,
            "fallbacks": self.dispatcher.controller.status(),  # each flag: should be, why, trouble
            "waiting": self.dispatcher.waiting,  # runs deferred or waiting for their time, and why
            "rules": self.rule_rows(),
        }

    async def overview(self) -> dict[str, Any]:
        """/api/status, ``specguard status`` and the page: ``status()`` and what the store holds."""
        return await overview.gather(
            self.status(), self.health(), self.store, self.dispatcher.actions, time.time(), self.started_at
        )

    def rule_rows(self) -> list[dict[str, Any]]:
        return rule_rows(
            self.loaded.enabled_rules(),
            self.states,
            self.rule_errors,
            self.rule_verdicts,
            self.loaded.config.interval,
        )


def _alert_trigger(receipts: Sequence[Receipt]) -> str:
    deliveries = sorted({r.delivery_id for r in receipts})
    which = (
        f"delivery {deliveries[0]}"
        if len(deliveries) == 1
        else f"deliveries {deliveries[0]}-{deliveries[-1]}"
    )
    return trigger_of(receipts, which)


def _rule_verdict(outcome: Outcome, result: SourceResult) -> tuple[str, str | None]:
    """What a rule without series says, and why: an error, warming up, or no data (with the source's
    errors, which are usually the reason)."""
    if outcome.error is not None:
        return Verdict.ERROR.value, outcome.error
    if result.warming:
        return Verdict.WARMING_UP.value, "waiting for samples from " + ", ".join(sorted(result.warming))
    reason = result.detail.get("scrape_errors")
    return Verdict.NO_DATA.value, f"no data; scrape failed: {reason}" if reason else "no data"
