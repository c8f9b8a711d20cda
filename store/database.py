"""The store: specguard's memory, in SQLite (WAL), and ``Store``, its way in from the event loop.

Rule series states, every event, and every action run (an outbox: a run is written as ``pending``
in the same transaction as the state change that caused it, and marked done after it ran). A
restarted daemon resumes from here: a firing rule is still firing and does not fire again, and a
run that was pending or interrupted is carried out.

All SQLite work happens on one writer thread, so the event loop never blocks on disk. The tables
are in ``schema``, the connections and ``transaction`` in ``connection``, an evaluation's commit
in ``commits`` and the readers of events and runs in ``queries``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from specguard.store import commits, queries
from specguard.store.commits import Guard
from specguard.store.connection import connect, open_database, transaction
from specguard.store.records import ActionRun, EventRecord, RunOutcome, SeriesState

T = TypeVar("T")


class StoreError(Exception):
    """The store cannot be read or written; the message names the file and the reason."""


@contextlib.asynccontextmanager
async def opened(path: Path) -> AsyncIterator[Store]:
    """The store at ``path``, open for the block (the one-shot commands' way in)."""
    store = Store(path)
    try:
        await store.open()
        yield store
    finally:
        await store.close()


class Store:
    """Async facade over one SQLite database file, used from the event loop."""

    def __init__(self, path: Path, clock: Callable[[], float] | None = None):
        self.path = path
        # What the times it writes are read from: a test's fake clock, or time.time as it is when
        # called (a test may put its own in its place).
        self.clock: Callable[[], float] = clock or (lambda: time.time())
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specguard-store")
        self._db: sqlite3.Connection | None = None
        # A second connection to the same file for bookkeeping whose commits need not be synced on
        # their own (WAL keeps every commit in order; the next synced commit or a checkpoint makes
        # them durable). Same thread, so the two never write at once.
        self._unsynced: sqlite3.Connection | None = None
        self._refuse = False  # refuse_writes (tests)
        # Called on the event loop with an action's name once its memory changed (the dispatcher
        # shows what the action holds on /metrics, whoever changed it: a run, a step by hand).
        self.memory_listeners: list[Callable[[str], None]] = []

    async def _call(self, fn: Callable[[sqlite3.Connection], T], synced: bool = True) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_db, fn, synced)

    async def call(self, fn: Callable[[sqlite3.Connection], T], synced: bool = True) -> T:
        """Run ``fn`` on the writer thread (for the modules that own other tables, such as the
        webhook inbox). ``synced=False``: its commits are not synced to disk on their own, for
        bookkeeping a power cut may undo (and that is then redone). Raises StoreError when SQLite
        fails."""
        return await self._call(fn, synced)

    def _with_db(self, fn: Callable[[sqlite3.Connection], T], synced: bool = True) -> T:
        try:
            if self._db is None:
                self._db = open_database(self.path)
            if synced:
                return fn(self._db)
            if self._unsynced is None:
                self._unsynced = connect(self.path, synchronous="NORMAL")
                if self._refuse:
                    self._unsynced.execute("PRAGMA query_only = ON")
            return fn(self._unsynced)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the state store {self.path}: {exc}") from exc

    async def open(self) -> None:
        """Create or open the database. Raises StoreError naming the path and what to do."""
        try:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the state directory {self.path.parent}: {exc.strerror or exc}; create it, "
                "make it writable for the user specguard runs as, or set state_dir"
            ) from None
        if not os.access(self.path.parent, os.W_OK | os.X_OK):
            raise StoreError(
                f"the state directory {self.path.parent} is not writable for this user; fix its "
                "permissions or set state_dir"
            )
        await self._call(lambda db: None)

    async def check_writable(self) -> None:
        """Write one row for real (a transaction that changes nothing succeeds even on a full disk).
        Raises StoreError when the store still cannot be written."""
        await self._call(
            lambda db: _update(
                db, "INSERT OR REPLACE INTO meta VALUES ('last_write_check', ?)", (repr(self.clock()),)
            )
        )

    async def refuse_writes(self, refuse: bool) -> None:
        """Make every write fail, as on a read-only file system (``refuse``), or stop doing so.

        For tests: the failure path without a full disk (the integration tier fills a real one).
        """
        self._refuse = refuse

        def apply(db: sqlite3.Connection) -> None:
            for each in (db, self._unsynced):
                if each is not None:
                    each.execute(f"PRAGMA query_only = {'ON' if refuse else 'OFF'}")

        await self._call(apply)

    async def close(self) -> None:
        def shut(db: sqlite3.Connection) -> None:
            if self._unsynced is not None:
                self._unsynced.close()
                self._unsynced = None
            db.close()
            self._db = None

        if self._db is not None:
            await self._call(shut)
        self._executor.shutdown(wait=True)

    async def load_states(self) -> dict[str, dict[str, SeriesState]]:
        return await self._call(commits.load_states)

    async def commit_evaluation(
        self,
        rule: str,
        states: Mapping[str, SeriesState],
        records: Sequence[EventRecord],
        guard: Guard | None = None,
    ) -> list[int]:
        """Replace the rule's states and add its events and runs, atomically. Each pending run
        passes ``guard`` in the same transaction. Returns pending run ids."""
        return await self._call(lambda db: commits.commit(db, rule, states, records, guard=guard))

    async def commit_series(
        self,
        rule: str,
        states: Mapping[str, SeriesState],
        forgotten: Sequence[str],
        records: Sequence[EventRecord],
        guard: Guard | None = None,
    ) -> list[int]:
        """Like commit_evaluation, for some of the rule's series: these states are written over
        their rows, the forgotten ones deleted, the others left as they are."""
        return await self._call(lambda db: commits.commit(db, rule, states, records, forgotten, guard))

    async def forget_rules(self, keep: set[str]) -> int:
        """Drop the states of rules that are no longer configured."""
        return await self._call(lambda db: commits.forget(db, keep))

    async def runs_to_do(self, ids: Sequence[int] | None = None, now: float | None = None) -> list[ActionRun]:
        """Runs still pending and due by ``now``, or started and never finished (the daemon
        stopped mid-run)."""
        at = self.clock() if now is None else now
        return await self._call(lambda db: queries.runs_to_do(db, ids, at))

    async def event_outcomes(self, event_id: int) -> list[RunOutcome]:
        """How the event's finished runs ended, in order."""

        def read(db: sqlite3.Connection) -> list[RunOutcome]:
            rows = db.execute(
                "SELECT e.rule, e.series, e.kind, r.action, r.mode, r.status, r.detail, r.finished FROM action_runs r "
                "JOIN events e ON e.id = r.event_id WHERE r.event_id = ? AND r.status IN ('ok', 'failed') ORDER BY r.id",
                (event_id,),
            )
            return [
                RunOutcome(
                    r["rule"],
                    r["series"],
                    r["kind"],
                    r["action"],
                    r["mode"],
                    r["status"],
                    r["detail"],
                    r["finished"] or 0.0,
                )
                for r in rows
            ]

        return await self._call(read)

    async def next_due(self) -> float | None:
        """When the earliest run that waits is due: a restore in its quiet period, a retry after
        its backoff, a deferral (a silence, a cooldown, the budget) that may end."""
        row = await self._call(
            lambda db: db.execute(
                "SELECT min(not_before) FROM action_runs WHERE status IN ('pending', 'deferred') "
                "AND not_before IS NOT NULL"
            ).fetchone()
        )
        return None if row[0] is None else float(row[0])

    async def retry_run(self, run_id: int, detail: str, not_before: float) -> None:
        """Back to pending, to be carried out again at ``not_before`` (a restore whose canary
        failed)."""
        await self._call(
            lambda db: _update(
                db,
                "UPDATE action_runs SET status='pending', detail=?, not_before=? WHERE id=?",
                (detail, not_before, run_id),
            )
        )

    async def memory_read(self, action: str, key: str) -> Any:
        def read(db: sqlite3.Connection) -> Any:
            row = db.execute(
                "SELECT value FROM action_memory WHERE action=? AND key=?", (action, key)
            ).fetchone()
            return None if row is None else json.loads(row["value"])

        return await self._call(read)

    async def memory_update(
        self,
        action: str,
        key: str,
        change: Callable[[Any], Any],
        notes: Callable[[], Sequence[tuple[int, str]]] | None = None,
    ) -> Any:
        """``change(current)`` stored as the action's value under ``key``, in one transaction on
        the writer thread: no other update comes in between. ``notes()``, called after
        ``change``, gives (event id, text) lines for history, written in the same transaction."""

        def update(db: sqlite3.Connection) -> Any:
            with transaction(db):
                row = db.execute(
                    "SELECT value FROM action_memory WHERE action=? AND key=?", (action, key)
                ).fetchone()
                value = change(None if row is None else json.loads(row["value"]))
                now = self.clock()
                db.execute(
                    "INSERT OR REPLACE INTO action_memory (action, key, value, updated) VALUES (?,?,?,?)",
                    (action, key, json.dumps(value), now),
                )
                for event_id, text in notes() if notes is not None else ():
                    # a note naming an event this store does not have is dropped, not the update
                    if db.execute("SELECT 1 FROM events WHERE id=?", (event_id,)).fetchone():
                        db.execute(
                            "INSERT INTO action_notes (event_id, action, at, text) VALUES (?,?,?,?)",
                            (event_id, action, now, text),
                        )
            return value

        value = await self._call(update)
        for listener in list(self.memory_listeners):
            listener(action)
        return value

    async def start_run(self, run_id: int) -> None:
        # Not synced on its own: losing it to a power cut loses an attempt count, nothing else
        # (the run is still pending, and runs again).
        await self._call(
            lambda db: _update(
                db,
                "UPDATE action_runs SET status='running', started=?, attempts=attempts+1 WHERE id=?",
                (self.clock(), run_id),
            ),
            synced=False,
        )

    async def skip_run(self, run_id: int, reason: str) -> None:
        """Record that a pending run will not be carried out, and why."""
        await self._call(
            lambda db: _update(
                db,
                "UPDATE action_runs SET status='skipped', reason=?, finished=? WHERE id=?",
                (reason, self.clock(), run_id),
            )
        )

    async def finish_run(self, run_id: int, status: str, detail: str) -> None:
        # Not synced on its own either: after a power cut a run whose end was lost is carried out
        # again (actions are idempotent); the next synced commit makes it durable.
        await self._call(
            lambda db: _update(
                db,
                "UPDATE action_runs SET status=?, detail=?, finished=? WHERE id=?",
                (status, detail, self.clock(), run_id),
            ),
            synced=False,
        )

    async def events(
        self, rule: str | None = None, limit: int = 100, since: float | None = None
    ) -> list[dict[str, Any]]:
        return await self._call(lambda db: queries.latest_events(db, rule, limit, since))

    async def history(
        self, rule: str | None = None, limit: int = 50, since: float | None = None
    ) -> list[dict[str, Any]]:
        """The latest events (at or after ``since``), newest first, each with its action runs
        (``runs``: action, mode, status, reason, detail), what actions noted for it later (``notes``:
        action, at, text: a Slack notice delivered) and the trigger that moved the rule."""
        return await self._call(lambda db: queries.history(db, rule, limit, since))

    async def run_of(self, run_id: int) -> ActionRun | None:
        """One run with its event, as the dispatcher carries runs out."""
        found = await self._call(lambda db: queries.runs_to_do(db, [run_id], math.inf, any_status=True))
        return found[0] if found else None

    async def action_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._call(
            lambda db: queries.rows(db, "SELECT * FROM action_runs ORDER BY id DESC LIMIT ?", (limit,))
        )


def _update(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> None:
    db.execute(sql, params)
