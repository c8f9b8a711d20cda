"""The webhook's inbox in the store: each delivery and the alert states it brought, written before
the delivery is answered. Deliveries that arrive together are written in one transaction (one
fsync), so a burst from Alertmanager costs one disk sync, not one per request.

Deduplication is the store's: an alert state is kept once per (fingerprint, status, startsAt), the
key Alertmanager's at-least-once delivery repeats (retries after a lost answer, repeat_interval,
HA peers), across specguard's restarts too.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from pydantic_core import to_json

from specguard.daemon.alertmanager.book import Receipt
from specguard.daemon.alertmanager.payload import Message
from specguard.store.connection import transaction
from specguard.store.database import Store

# Deliveries written in one transaction at most: a burst is split, so no write holds the store long.
MAX_BATCH = 256
# Receipts (and deliveries) older than this are dropped, except each alert's newest state: the
# deduplication window. Alertmanager repeats for as long as an alert fires, but a repeat of a state
# already known is a duplicate whatever its age, because the newest state per alert is kept.
RECEIPT_RETENTION = 7 * 86400.0


@dataclass(frozen=True)
class Stored:
    """What one delivery added: its id, the alert states new to specguard, and how many it repeated."""

    delivery_id: int
    new: tuple[Receipt, ...]
    duplicates: int
    to_act_on: tuple[Receipt, ...] = ()  # the new ones some rule acts on


@dataclass(frozen=True)
class _Row:
    """One alert of a delivery, ready for its INSERT (prepared on the event loop, so the writer
    thread runs SQL and little Python: the two take turns on the GIL)."""

    fingerprint: str
    status: str
    starts_at: str
    ends_at: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    labels_json: str
    annotations_json: str
    to_act_on: bool


@dataclass(frozen=True)
class _Delivery:
    message: Message
    received: float
    rows: tuple[_Row, ...]


class Inbox:
    def __init__(
        self, store: Store, concerns: Callable[[Mapping[str, str], str], bool] = lambda *_: True
    ) -> None:
        """``concerns(labels, status)``: whether a rule acts on such an alert. One no rule acts on
        is stored as done already, so it costs no second write."""
        self.store = store
        self.concerns = concerns
        self._queue: list[tuple[_Delivery, asyncio.Future[Stored]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def put(self, message: Message, received: float) -> Stored:
        """Store ``message``; returns once it is on disk. Raises StoreError when it cannot be."""
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        rows = tuple(
            _Row(
                alert.fingerprint,
                alert.status.value,
                alert.starts,
                alert.ends_at.isoformat() if alert.ends_at is not None else None,
                alert.labels,
                alert.annotations,
                to_json(alert.labels).decode(),  # pydantic-core's encoder: a fifth of json.dumps's time
                to_json(alert.annotations).decode(),
                self.concerns(alert.labels, alert.status.value),
            )
            for alert in message.alerts
        )
        self._queue.append((_Delivery(message, received, rows), future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            # One turn of the event loop first: requests whose bodies have arrived join this
            # batch, and share its sync to disk (the costly part of a small commit).
            await asyncio.sleep(0)
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            deliveries = [delivery for delivery, _ in batch]
            try:
                written = await self.store.call(partial(_write, deliveries=deliveries))
            except Exception as exc:  # StoreError, or a bug: every waiting request hears of it
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (delivery, future), (delivery_id, ids) in zip(batch, written, strict=True):
                if not future.done():
                    future.set_result(_stored(delivery, delivery_id, ids))

    async def known(self) -> list[Receipt]:
        """The newest receipt of every alert, to rebuild the alert book at start."""
        return await self.store.call(_known)

    async def unprocessed(self) -> list[Receipt]:
        """Receipts stored but not yet acted on (the daemon stopped in between)."""
        return await self.store.call(lambda db: _receipts(db, "WHERE processed IS NULL ORDER BY id"))

    async def mark_processed(self, ids: Sequence[int], at: float) -> None:
        # Not synced on its own: lost to a power cut, the receipts are acted on again at the next
        # start, which changes nothing (the engine's states are stored, synced, before this).
        def mark(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.executemany("UPDATE alert_receipts SET processed=? WHERE id=?", [(at, i) for i in ids])

        if ids:
            await self.store.call(mark, synced=False)

    async def prune(self, before: float) -> int:
        """Drop receipts and deliveries older than ``before``, keeping each alert's newest state."""
        return await self.store.call(lambda db: _prune(db, before))


def _stored(delivery: _Delivery, delivery_id: int, ids: Sequence[int | None]) -> Stored:
    """What a written delivery added: a receipt for each alert state new to the store."""
    new: list[Receipt] = []
    acted: list[Receipt] = []
    for row, rowid in zip(delivery.rows, ids, strict=True):
        if rowid is None:
            continue  # stored before: a repeat
        receipt = Receipt(
            rowid,
            delivery_id,
            row.fingerprint,
            row.status,
            row.starts_at,
            row.ends_at,
            dict(row.labels),
            dict(row.annotations),
            delivery.received,
        )
        new.append(receipt)
        if row.to_act_on:
            acted.append(receipt)
    return Stored(delivery_id, tuple(new), len(delivery.rows) - len(new), tuple(acted))


def _write(db: sqlite3.Connection, deliveries: Sequence[_Delivery]) -> list[tuple[int, list[int | None]]]:
    """Each delivery's id, and the id of each of its alert states (None: stored before)."""
    out: list[tuple[int, list[int | None]]] = []
    with transaction(db):
        for delivery in deliveries:
            message = delivery.message
            delivery_id = db.execute(
                "INSERT INTO deliveries (received, group_key, receiver, status, alerts, new_alerts, truncated) "
                "VALUES (?,?,?,?,?,0,?)",
                (
                    delivery.received,
                    message.group_key,
                    message.receiver,
                    message.status.value,
                    len(message.alerts),
                    message.truncated_alerts,
                ),
            ).lastrowid
            assert delivery_id is not None
            ids: list[int | None] = []
            for row in delivery.rows:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO alert_receipts (delivery_id, fingerprint, status, starts_at, "
                    "ends_at, labels, annotations, received, processed) VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        delivery_id,
                        row.fingerprint,
                        row.status,
                        row.starts_at,
                        row.ends_at,
                        row.labels_json,
                        row.annotations_json,
                        delivery.received,
                        None if row.to_act_on else delivery.received,  # no rule acts on it: done
                    ),
                )
                ids.append(cursor.lastrowid if cursor.rowcount == 1 else None)
            new = sum(1 for each in ids if each is not None)
            if new:
                db.execute("UPDATE deliveries SET new_alerts=? WHERE id=?", (new, delivery_id))
            out.append((delivery_id, ids))
    return out


def _receipt(row: sqlite3.Row) -> Receipt:
    return Receipt(
        row["id"],
        row["delivery_id"],
        row["fingerprint"],
        row["status"],
        row["starts_at"],
        row["ends_at"],
        json.loads(row["labels"]),
        json.loads(row["annotations"]),
        row["received"],
    )


def _receipts(db: sqlite3.Connection, where: str) -> list[Receipt]:
    return [_receipt(row) for row in db.execute(f"SELECT * FROM alert_receipts {where}")]


# A receipt that is its alert's newest state: no later episode (startsAt, stored in one UTC
# spelling, so its text orders as its time), and not a firing state its resolution followed.
_NEWEST = """NOT EXISTS (SELECT 1 FROM alert_receipts o WHERE o.fingerprint = r.fingerprint
    AND (o.starts_at > r.starts_at OR (o.starts_at = r.starts_at AND o.status = 'resolved'
    AND r.status = 'firing')))"""


def _known(db: sqlite3.Connection) -> list[Receipt]:
    # Only each alert's newest state, not the week of repeats kept for deduplication.
    return _receipts(db, f"r WHERE {_NEWEST} ORDER BY id")


def _prune(db: sqlite3.Connection, before: float) -> int:
    with transaction(db):
        removed = db.execute(
            f"DELETE FROM alert_receipts WHERE id IN (SELECT id FROM alert_receipts r "
            f"WHERE r.received < ? AND NOT ({_NEWEST}))",
            (before,),
        ).rowcount
        db.execute(
            "DELETE FROM deliveries WHERE received < ? AND id NOT IN "
            "(SELECT DISTINCT delivery_id FROM alert_receipts)",
            (before,),
        )
    return removed
