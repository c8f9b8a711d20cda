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
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.alertmanager.book import Receipt
from daemon.alertmanager.payload import Message
from daemon.store import Store, transaction, unsynced

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


class Inbox:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: list[tuple[Message, float, asyncio.Future[Stored]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def put(self, message: Message, received: float) -> Stored:
        """Store ``message``; returns once it is on disk. Raises StoreError when it cannot be."""
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        self._queue.append((message, received, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            items = [(message, received) for message, received, _ in batch]
            try:
                results = await self.store.call(lambda db, items=items: _write(db, items))  # type: ignore[misc]
            except Exception as exc:  # StoreError, or a bug: every waiting request hears of it
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

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
            with unsynced(db), transaction(db):
                db.executemany("UPDATE alert_receipts SET processed=? WHERE id=?", [(at, i) for i in ids])

        if ids:
            await self.store.call(mark)

    async def prune(self, before: float) -> int:
        """Drop receipts and deliveries older than ``before``, keeping each alert's newest state."""
        return await self.store.call(lambda db: _prune(db, before))

    async def deliveries(self, limit: int = 20) -> list[dict[str, object]]:
        def rows(db: sqlite3.Connection) -> list[dict[str, object]]:
            cursor = db.execute("SELECT * FROM deliveries ORDER BY id DESC LIMIT ?", (limit,))
            return [dict(row) for row in cursor]

        return await self.store.call(rows)


def _write(db: sqlite3.Connection, items: Sequence[tuple[Message, float]]) -> list[Stored]:
    out: list[Stored] = []
    with transaction(db):
        for message, received in items:
            delivery = db.execute(
                "INSERT INTO deliveries (received, group_key, receiver, status, alerts, new_alerts, truncated) "
                "VALUES (?,?,?,?,?,0,?)",
                (
                    received,
                    message.group_key,
                    message.receiver,
                    message.status.value,
                    len(message.alerts),
                    message.truncated_alerts,
                ),
            ).lastrowid
            assert delivery is not None
            new: list[Receipt] = []
            for alert in message.alerts:
                ends = alert.ends_at.isoformat() if alert.ends_at is not None else None
                labels = json.dumps(alert.labels, sort_keys=True)
                annotations = json.dumps(alert.annotations, sort_keys=True)
                cursor = db.execute(
                    "INSERT OR IGNORE INTO alert_receipts (delivery_id, fingerprint, status, starts_at, "
                    "ends_at, labels, annotations, received) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        delivery,
                        alert.fingerprint,
                        alert.status.value,
                        alert.starts,
                        ends,
                        labels,
                        annotations,
                        received,
                    ),
                )
                if cursor.rowcount == 1 and cursor.lastrowid is not None:
                    new.append(
                        Receipt(
                            cursor.lastrowid,
                            delivery,
                            alert.fingerprint,
                            alert.status.value,
                            alert.starts,
                            ends,
                            dict(alert.labels),
                            dict(alert.annotations),
                            received,
                        )
                    )
            db.execute("UPDATE deliveries SET new_alerts=? WHERE id=?", (len(new), delivery))
            out.append(Stored(delivery, tuple(new), len(message.alerts) - len(new)))
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


def _known(db: sqlite3.Connection) -> list[Receipt]:
    # Every receipt in order: the book keeps the newest state of each alert.
    return _receipts(db, "ORDER BY id")


def _prune(db: sqlite3.Connection, before: float) -> int:
    with transaction(db):
        removed = db.execute(
            "DELETE FROM alert_receipts WHERE received < ? AND id NOT IN "
            "(SELECT MAX(id) FROM alert_receipts GROUP BY fingerprint)",
            (before,),
        ).rowcount
        db.execute(
            "DELETE FROM deliveries WHERE received < ? AND id NOT IN "
            "(SELECT DISTINCT delivery_id FROM alert_receipts)",
            (before,),
        )
    return removed
