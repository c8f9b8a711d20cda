"""What the parts of the running daemon share: the loaded config, its metrics, the store, the
source, the dispatcher, the series' states and the alert book; and how a store that cannot be
written is noted (once per change)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from specguard.config.loading import Loaded, LoadedRule
from specguard.daemon import systemd
from specguard.daemon.alertmanager.book import AlertBook
from specguard.daemon.fleet import DaemonFleet
from specguard.daemon.overruns import Overruns
from specguard.daemon.wiring import make_history_source, make_source
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.sources.base import Source
from specguard.store.database import Store
from specguard.store.records import EventRecord, SeriesState

log = logging.getLogger("specguard")


class Shared:
    """Built from the config at the start; a reload replaces ``loaded``, the sources and the alert
    book, and tells the dispatcher the new rules and actions."""

    def __init__(self, loaded: Loaded, clock: Callable[[], float] | None = None) -> None:
        """``clock``: what every moment the daemon judges and stores is read from (``time.time``
        as it is when called, unless given: a backtest replays history on a simulated one)."""
        self.loaded = loaded
        self.clock: Callable[[], float] = clock or (lambda: time.time())
        self.metrics = DaemonMetrics()
        self.overruns = Overruns(self.metrics)
        self.metrics.show_baseline(loaded.baseline)
        self.metrics.show_rules(r.name for r in loaded.enabled_rules())
        self.store = Store(loaded.config.store_file(), clock=self.clock)
        self.source: Source = make_source(loaded)
        # With the Prometheus source, the servers whose history is kept are scraped for it alone.
        self.history_source: Any = make_history_source(loaded.config)
        self.dispatcher = Dispatcher(
            self.store, loaded.actions, loaded.config.dry_run, self.metrics, rules=loaded.rules
        )
        # With a coordination: section, the disrupting actions take fleet slots first.
        self.fleet = DaemonFleet(loaded.config.coordination, self.store)
        self.fleet.attach(loaded.actions)
        # What Alertmanager has said, alert by alert, of the alerts some rule watches: the others
        # are only stored (a reload that adds a rule reads them back from the store).
        self.alerts = AlertBook()
        self.states: dict[str, dict[str, SeriesState]] = {}
        self.rule_errors: dict[str, str | None] = {}
        self.rule_verdicts: dict[str, tuple[str, str | None]] = {}  # rule -> (verdict, why) without series
        self.store_error: str | None = None  # why the store cannot be written, while it cannot
        self.started_at = self.clock()
        self.last_round: float | None = None
        self.last_round_of: dict[float, float | None] = {}  # interval -> when its last round finished
        self.notifier = systemd.Notifier()
        self.status_told: str | None = None  # the last STATUS= sent
        # Evaluation rounds and batches of alerts in progress: a stop lets them finish.
        self.busy: set[asyncio.Task[Any]] = set()
        # Called with each recorded event after it is stored: how an embedding program (the demo)
        # follows what the daemon decides.
        self.on_event: list[Callable[[LoadedRule, EventRecord], None]] = []

    async def forget_unconfigured(self) -> None:
        """Forget the states of the rules no longer configured, or disabled: enabled again, a rule
        starts from inactive, as a Prometheus alerting rule does, and a breach then is a new
        incident. At the start and at every reload."""
        configured = {r.name for r in self.loaded.rules if r.rule.enabled}
        for name in [name for name in self.states if name not in configured]:
            del self.states[name]
        dropped = await self.store.forget_rules(configured)
        if dropped:
            log.info("forgot the state of %d rule(s) no longer configured or disabled", dropped)

    def store_failed(self, message: str) -> None:
        self.metrics.store_errors.inc()
        if message != self.store_error:  # once per change, not once per rule and round
            log.error("%s: rules are evaluated but nothing changes until it can be written", message)
        self.store_error = message
