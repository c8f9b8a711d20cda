"""Alertmanager's deliveries, as the daemon takes them in: each stored (the webhook's answer waits
for that), the alert book told, then every rule the alerts concern evaluated at once, in the order
they were stored, and the alerts marked done; and the receipts pruned once old."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

from specguard.daemon.alertmanager.book import AlertBook, Receipt, trigger_of
from specguard.daemon.alertmanager.inbox import RECEIPT_RETENTION, Inbox, Stored
from specguard.daemon.alertmanager.payload import Message
from specguard.daemon.round import Rounds
from specguard.daemon.shared import Shared
from specguard.rules.durations import format_duration
from specguard.rules.matchers import all_match
from specguard.store.database import StoreError

log = logging.getLogger("specguard")

# Alert states acted on in one step (one evaluation and one commit per rule they concern).
ALERT_BATCH = 256


class Intake:
    """The webhook's sink: ``deliver``; ``run`` acts on what was stored, batch by batch."""

    def __init__(self, shared: Shared, rounds: Rounds) -> None:
        self.shared = shared
        self.rounds = rounds
        self.inbox = Inbox(shared.store, self._acted_on)
        self.queue: asyncio.Queue[list[Receipt]] = asyncio.Queue()
        self._rebuilding: list[Receipt] | None = None  # receipts taken in while the book is rebuilt

    async def resume(self) -> None:
        """At the start: the alert book from the store, and the alerts stored before the last stop
        and not acted on queued to be."""
        self.shared.alerts.load(r for r in await self.inbox.known() if self._watched(r.labels))
        unprocessed = await self.inbox.unprocessed()  # stored, then the process stopped
        if unprocessed:
            log.info("%d alert(s) received before the last stop are acted on now", len(unprocessed))
            self.queue.put_nowait(unprocessed)

    async def deliver(self, message: Message, received: float) -> Stored:
        """A webhook delivery: stored (the answer waits for this), then acted on in order."""
        stored = await self.inbox.put(message, received)
        for receipt in stored.new:
            if receipt not in stored.to_act_on and self._watched(receipt.labels):
                self._book(receipt)  # a rule reads it, but this status does not trigger it
        if stored.to_act_on:
            self.queue.put_nowait(list(stored.to_act_on))
        return stored

    def _watched(self, labels: Mapping[str, str]) -> bool:
        """Whether some rule's ``alert.match`` takes an alert with ``labels`` (whatever its status)."""
        return any(
            item.rule.alert is not None and all_match(item.rule.alert.matchers, labels)
            for item in self.shared.loaded.enabled_rules()
        )

    def _book(self, receipt: Receipt) -> None:
        self.shared.alerts.update(receipt)
        if self._rebuilding is not None:
            self._rebuilding.append(receipt)

    async def rebuild_book(self) -> None:
        """The alert book anew from the store, for the rules as they are now (after a reload).
        Receipts taken in meanwhile are applied again to the new book: the store had them too, or
        was about to."""
        self._rebuilding = []
        try:
            book = AlertBook()
            book.load(r for r in await self.inbox.known() if self._watched(r.labels))
            book.load(r for r in self._rebuilding if self._watched(r.labels))  # stale ones are ignored
            self.shared.alerts = book
        finally:
            self._rebuilding = None

    def _acted_on(self, labels: Mapping[str, str], status: str) -> bool:
        """Whether an alert with ``labels`` and ``status`` moves or triggers some rule now."""
        return any(item.rule.takes_alert(labels, status) for item in self.shared.loaded.enabled_rules())

    async def run(self) -> None:
        """Alert states in the order they were stored: the alert book learns them, then every rule
        they concern is evaluated at once, and they are marked done."""
        waiting: list[Receipt] = []
        while True:
            if not waiting:
                waiting = await self.queue.get()
            while not self.queue.empty():
                waiting.extend(self.queue.get_nowait())
            # A bounded batch: a backlog is worked off in steps, each one transaction, between
            # which deliveries keep being stored (they wait for the same writer thread).
            receipts, waiting = waiting[:ALERT_BATCH], waiting[ALERT_BATCH:]
            # One task per batch, counted as a round: a stop lets it finish as it lets a round
            # finish (the loop itself waits forever, and is simply cancelled).
            task = asyncio.get_running_loop().create_task(self._act_on_alerts(receipts))
            self.shared.busy.add(task)
            try:
                await task
            finally:
                self.shared.busy.discard(task)

    async def _act_on_alerts(self, receipts: list[Receipt]) -> None:
        shared = self.shared
        for receipt in receipts:
            self._book(receipt)
        for item in shared.loaded.enabled_rules():
            concerned = [r for r in receipts if item.rule.takes_alert(r.labels, r.status)]
            if not concerned:
                continue
            try:
                await self.rounds.evaluate_one(item, _alert_trigger(concerned), concerned)
            except StoreError as exc:
                shared.store_failed(str(exc))
                # Left unmarked: the schedule takes these alerts up once the store can be written
                # (their series disagree with their states), and the next start acts on them.
                return
            except Exception as exc:
                log.exception("rule %s: evaluation on an Alertmanager delivery failed", item.name)
                self.rounds.note_error(item.name, f"evaluation failed: {type(exc).__name__}: {exc}")
        try:
            await self.inbox.mark_processed([r.id for r in receipts], time.time())
        except StoreError as exc:
            shared.store_failed(str(exc))

    async def prune(self) -> None:
        now = time.time()
        self.shared.alerts.prune(now)
        try:
            removed = await self.inbox.prune(now - RECEIPT_RETENTION)
        except StoreError as exc:
            self.shared.store_failed(str(exc))
            return
        if removed:
            log.info("dropped %d alert receipts older than %s", removed, format_duration(RECEIPT_RETENTION))


def _alert_trigger(receipts: Sequence[Receipt]) -> str:
    deliveries = sorted({r.delivery_id for r in receipts})
    which = (
        f"delivery {deliveries[0]}"
        if len(deliveries) == 1
        else f"deliveries {deliveries[0]}-{deliveries[-1]}"
    )
    return trigger_of(receipts, which)
