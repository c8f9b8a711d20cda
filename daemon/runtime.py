"""The running daemon: what its parts share (``shared``), the parts composed (the rounds, the
Alertmanager intake, the scheduler's jobs, the reload), and how it starts and stops: the store
opened and what it left resumed, the HTTP server, the schedule, READY=1 once every rule has been
evaluated, signals; and a stop that lets a round in progress finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from specguard.config.loading import Loaded
from specguard.daemon import page, self_status, systemd
from specguard.daemon.alertmanager.inbox import Stored
from specguard.daemon.alertmanager.payload import Message
from specguard.daemon.alertmanager.receiver import make_handler
from specguard.daemon.intake import Intake
from specguard.daemon.jobs import Jobs
from specguard.daemon.reload import Reloader
from specguard.daemon.reports import WeeklyReports
from specguard.daemon.round import Rounds
from specguard.daemon.server import Webhook, start_server
from specguard.daemon.shared import Shared
from specguard.dispatch import ladder, silences
from specguard.store.database import StoreError
from specguard.store.records import State

log = logging.getLogger("specguard")

SWITCH_INTERVAL = 0.001  # seconds (CPython's default: 0.005)
# How long a stop waits for a round in progress (its action runs) to finish; below systemd's
# TimeoutStopSec. What is cut off is still in the store and runs at the next start.
SHUTDOWN_GRACE = 20.0


class Daemon(Shared):
    """What the parts share (its own attributes: ``loaded``, ``store``, ``source``, ``states``...),
    and the parts: ``rounds``, ``intake``, ``jobs``, ``reloader``."""

    def __init__(
        self,
        loaded: Loaded,
        config_file: Path | None = None,
        rule_files: Sequence[str] = (),
        overrides: Mapping[str, Any] | None = None,
        reports: WeeklyReports | None = None,
    ):
        super().__init__(loaded)
        self.rounds = Rounds(self)
        self.intake = Intake(self, self.rounds)
        self.jobs = Jobs(self, self.rounds, self.intake, reports)
        self.reloader = Reloader(self, self.intake, self.jobs, config_file, rule_files, overrides or {})
        self._connections_peak = 0  # the most connections the HTTP server held at once
        self._reload_after_start = False  # a SIGHUP came before READY=1: reload once ready
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._site_runner: Any = None
        self.port: int | None = None

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
        await self.forget_unconfigured()
        self.states = await self.store.load_states()
        firing = sum(1 for states in self.states.values() for s in states.values() if s.state is State.FIRING)
        log.info(
            "state loaded from %s: %d series, %d firing",
            self.store.path,
            sum(len(v) for v in self.states.values()),
            firing,
        )
        self.fleet.start()  # registered in the fleet before anything may take a slot
        await self.dispatcher.run()  # runs left unfinished by the previous process
        await self.intake.resume()
        await self._serve()
        self._spawn(self.intake.run())
        self._spawn(self.dispatcher.serve())  # restores, when their quiet period is over
        if handle_signals:
            self._install_signal_handlers()
        wd = systemd.watchdog_interval()
        if wd:
            self._spawn(self.notifier.watchdog(wd))
        self.rounds.expect(item.name for item in self.loaded.enabled_rules())
        self.jobs.start()
        self._spawn(self.jobs.catch_up_report())
        # Ready means serving and judging: the HTTP server listens (above) and every rule has been
        # evaluated once and its states stored, so what /api/status shows is real. A rule's
        # actions run beside the rounds: a slow one holds back neither the first round nor READY.
        # A stop asked for meanwhile (SIGTERM during the first round) ends the wait.
        waits = [asyncio.ensure_future(event.wait()) for event in (self.rounds.first_done, self._stop)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if self._stop.is_set():
            return
        self.status_told = self_status.status_line(self)
        self.notifier.ready(self.status_told)
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

    async def _serve(self) -> None:
        """The HTTP server: /healthz, /metrics, /api/status, the webhook, the write API, the page."""
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
        await self.jobs.stop(SHUTDOWN_GRACE)
        await self.dispatcher.quiesce(SHUTDOWN_GRACE)  # a run it started finishes, as a round's does
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.dispatcher.stop()  # a restart under way is resumed from its journal next time
        await self.fleet.close()  # slots still held end with their leases
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

    # --- what the parts do, asked of the daemon --------------------------------------------------

    @property
    def scheduler(self) -> AsyncIOScheduler | None:
        return self.jobs.scheduler

    async def evaluate_round(self, interval: float | None = None) -> None:
        """Evaluate the enabled rules of one interval (all of them when ``interval`` is None)."""
        await self.rounds.evaluate_round(interval)

    async def deliver(self, message: Message, received: float) -> Stored:
        """A webhook delivery: stored (the answer waits for this), then acted on in order."""
        return await self.intake.deliver(message, received)

    async def reload(self) -> bool:
        """Re-read the config (SIGHUP). An invalid new config leaves the running one in place."""
        return await self.reloader.reload()

    # --- what the HTTP server shows (server.Observed) ---------------------------------------------

    @property
    def registry(self) -> Any:
        return self.metrics.registry

    def health(self) -> tuple[bool, dict[str, Any]]:
        return self_status.health(self)

    def status(self) -> dict[str, Any]:
        return self_status.status(self)

    async def overview(self) -> dict[str, Any]:
        """/api/status, ``specguard status`` and the page: ``status()`` and what the store holds."""
        return await self_status.overview(self)

    def rule_rows(self) -> list[dict[str, Any]]:
        return self_status.rule_rows(self)

    def connections_held(self, count: int) -> None:
        """The HTTP server holds ``count`` connections now (after closing any beyond its cap)."""
        if count > self._connections_peak:
            self._connections_peak = count
            self.metrics.connections_peak.set(count)

    def connections_evicted(self) -> None:
        """The HTTP server closed an old connection to make room (a flood, or many idle clients)."""
        self.metrics.connections_evicted.inc()
