"""The store: specguard's memory, in SQLite (WAL).

Rule series states, every event, and every action run (an outbox: a run is written as ``pending``
in the same transaction as the state change that caused it, and marked done after it ran). A
restarted daemon resumes from here: a firing rule is still firing and does not fire again, and a
run that was pending or interrupted is carried out.

All SQLite work happens on one writer thread, so the event loop never blocks on disk.
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
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from specguard.store.records import Event, RunOutcome, SeriesState, State, Verdict

T = TypeVar("T")


class StoreError(Exception):
    """The store cannot be read or written; the message names the file and the reason."""


SCHEMA_VERSION = 8
BUSY_TIMEOUT = 5.0  # seconds a statement waits for another connection's lock
# Columns each schema version added to a table, so an older database is brought up to date.
_COLUMNS_SINCE = {
    2: (
        ("series_state", "ok_since REAL"),
        ("series_state", "last_data REAL"),
        ("series_state", "last_seen REAL"),
    ),
    3: (("events", "trigger TEXT NOT NULL DEFAULT 'schedule'"), ("series_state", "moved_by TEXT")),
    4: (("action_runs", "mode TEXT NOT NULL DEFAULT 'run'"), ("action_runs", "not_before REAL")),
    5: (("events", "since REAL"),),
    7: (("series_state", "detector TEXT"),),
    8: (("action_runs", "admitted REAL"),),
}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series_state (
    rule TEXT NOT NULL, series TEXT NOT NULL, labels TEXT NOT NULL, state TEXT NOT NULL,
    since REAL, breach_since REAL, last_breach REAL, consecutive INTEGER NOT NULL,
    verdict TEXT, value REAL, threshold REAL, error TEXT, last_eval REAL,
    ok_since REAL, last_data REAL, last_seen REAL, moved_by TEXT, detector TEXT,
    PRIMARY KEY (rule, series)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, rule TEXT NOT NULL,
    series TEXT NOT NULL, labels TEXT NOT NULL, kind TEXT NOT NULL, previous TEXT NOT NULL,
    value REAL, threshold REAL, severity TEXT NOT NULL, summary TEXT NOT NULL,
    annotations TEXT NOT NULL, shadow INTEGER NOT NULL, dry_run INTEGER NOT NULL,
    trigger TEXT NOT NULL DEFAULT 'schedule', since REAL
);
CREATE INDEX IF NOT EXISTS events_rule_at ON events (rule, at);
CREATE INDEX IF NOT EXISTS events_kind_at ON events (kind, at);
CREATE TABLE IF NOT EXISTS action_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT NULL REFERENCES events (id),
    action TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '', created REAL NOT NULL, started REAL, finished REAL,
    attempts INTEGER NOT NULL DEFAULT 0, mode TEXT NOT NULL DEFAULT 'run', not_before REAL,
    admitted REAL
);
CREATE INDEX IF NOT EXISTS action_runs_status ON action_runs (status);
CREATE INDEX IF NOT EXISTS action_runs_action_created ON action_runs (action, created);
CREATE INDEX IF NOT EXISTS action_runs_event ON action_runs (event_id);
-- Silences: a rule's firings (those whose labels match) run no action until the silence ends.
CREATE TABLE IF NOT EXISTS silences (
    id INTEGER PRIMARY KEY AUTOINCREMENT, rule TEXT NOT NULL, match TEXT NOT NULL,
    starts REAL NOT NULL, ends REAL NOT NULL, reason TEXT NOT NULL, author TEXT NOT NULL,
    created REAL NOT NULL, expired REAL
);
-- What each action remembers between runs and restarts (a flag's holders, a Slack thread): JSON.
CREATE TABLE IF NOT EXISTS action_memory (
    action TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (action, key)
);
-- What an action did for an event after its run, told to history (a Slack notice delivered).
CREATE TABLE IF NOT EXISTS action_notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT NULL REFERENCES events (id),
    action TEXT NOT NULL, at REAL NOT NULL, text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS action_notes_event ON action_notes (event_id);
-- Alertmanager webhook deliveries (one row per accepted POST), and each alert state they brought,
-- once: (fingerprint, status, starts_at) is the deduplication key across retries and restarts.
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, received REAL NOT NULL, group_key TEXT NOT NULL,
    receiver TEXT NOT NULL, status TEXT NOT NULL, alerts INTEGER NOT NULL, new_alerts INTEGER NOT NULL,
    truncated INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS alert_receipts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, delivery_id INTEGER NOT NULL REFERENCES deliveries (id),
    fingerprint TEXT NOT NULL, status TEXT NOT NULL, starts_at TEXT NOT NULL, ends_at TEXT,
    labels TEXT NOT NULL, annotations TEXT NOT NULL, received REAL NOT NULL, processed REAL,
    UNIQUE (fingerprint, status, starts_at)
);
CREATE INDEX IF NOT EXISTS alert_receipts_unprocessed ON alert_receipts (processed) WHERE processed IS NULL;
-- History for reports (daemon/history.py): per-minute rollups per vLLM server and model.
CREATE TABLE IF NOT EXISTS history_series (
    id INTEGER PRIMARY KEY AUTOINCREMENT, instance TEXT NOT NULL, model TEXT NOT NULL,
    UNIQUE (instance, model)
);
CREATE TABLE IF NOT EXISTS history_layouts (id INTEGER PRIMARY KEY AUTOINCREMENT, keys TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS history (
    series INTEGER NOT NULL, minute INTEGER NOT NULL, layout INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (series, minute)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS history_minute ON history (minute);
-- The same, summed by hour (and how many minutes each holds): what a week's report reads.
CREATE TABLE IF NOT EXISTS history_hours (
    series INTEGER NOT NULL, hour INTEGER NOT NULL, layout INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (series, hour)
) WITHOUT ROWID;
-- The last scrape of each target, the reference its next increase is counted from.
CREATE TABLE IF NOT EXISTS history_last (instance TEXT PRIMARY KEY, at REAL NOT NULL, snapshot TEXT NOT NULL);
-- Reports made on the schedule, one per scheduled time (never twice), and their files. Their
-- delivery to Slack is the slack action's outbox (action_memory).
CREATE TABLE IF NOT EXISTS reports (
    scheduled REAL PRIMARY KEY, made REAL NOT NULL, period_from REAL NOT NULL, period_to REAL NOT NULL,
    paths TEXT NOT NULL
);
"""


class RunStatus(StrEnum):
    """Where an action run stands. ``deferred``: a guard said "not now" (a silence, a cooldown, the
    budget), with the reason and the time it may go (``not_before``); it is looked at again on
    every tick and runs once the reason is gone, unless what it answered is over by then."""

    PENDING = "pending"  # admitted by the guards; carried out once due (``not_before``)
    RUNNING = "running"  # under way (a run found so at start was cut short: carried out again)
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # never to run, with the reason
    DEFERRED = "deferred"


class RunMode(StrEnum):
    RUN = "run"  # do what the action does (engage a flag, step k down, tell on-call)
    RESTORE = "restore"  # undo what a world-changing action did
    HOLD = "hold"  # a firing met the fallback already engaged: held, nothing written


OPEN = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.DEFERRED)


@dataclass(frozen=True)
class PlannedRun:
    """What the dispatcher decided for one action of an event."""

    action: str
    status: str  # RunStatus: pending | skipped | deferred
    reason: str = ""
    mode: str = "run"  # RunMode: run | restore (undo what a world-changing action did)
    # Not carried out before this time: a restore's quiet period, or when a deferral may end.
    not_before: float | None = None


# Given the transaction an event is written in and a run planned for it, the run as it is to be
# written: the guards' last word, taken where no other commit can slip in between.
Guard = Callable[[sqlite3.Connection, "Event", PlannedRun], PlannedRun]


@dataclass(frozen=True)
class EventRecord:
    """An event with what the dispatcher decided for it."""

    event: Event
    severity: str
    summary: str
    annotations: Mapping[str, str]
    shadow: bool
    dry_run: bool
    runs: Sequence[PlannedRun]
    trigger: str = "schedule"  # what evaluated the rule: the schedule, or an Alertmanager delivery


@dataclass(frozen=True)
class ActionRun:
    id: int
    event_id: int
    action: str
    status: str
    attempts: int
    mode: str
    at: float
    series: str
    rule: str
    kind: str
    labels: dict[str, str]
    value: float | None
    threshold: float | None
    severity: str
    summary: str
    annotations: dict[str, str]
    since: float | None = None  # a firing's: when its breach began


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
                self._db = _open(self.path)
            if synced:
                return fn(self._db)
            if self._unsynced is None:
                self._unsynced = _connect(self.path, synchronous="NORMAL")
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
        return await self._call(_load_states)

    async def commit_evaluation(
        self,
        rule: str,
        states: Mapping[str, SeriesState],
        records: Sequence[EventRecord],
        guard: Guard | None = None,
    ) -> list[int]:
        """Replace the rule's states and add its events and runs, atomically. Each pending run
        passes ``guard`` in the same transaction. Returns pending run ids."""
        return await self._call(lambda db: _commit(db, rule, states, records, guard=guard))

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
        return await self._call(lambda db: _commit(db, rule, states, records, forgotten, guard))

    async def forget_rules(self, keep: set[str]) -> int:
        """Drop the states of rules that are no longer configured."""
        return await self._call(lambda db: _forget(db, keep))

    async def runs_to_do(self, ids: Sequence[int] | None = None, now: float | None = None) -> list[ActionRun]:
        """Runs still pending and due by ``now``, or started and never finished (the daemon
        stopped mid-run)."""
        at = self.clock() if now is None else now
        return await self._call(lambda db: _runs_to_do(db, ids, at))

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
        return await self._call(lambda db: _events(db, rule, limit, since))

    async def history(
        self, rule: str | None = None, limit: int = 50, since: float | None = None
    ) -> list[dict[str, Any]]:
        """The latest events (at or after ``since``), newest first, each with its action runs
        (``runs``: action, mode, status, reason, detail), what actions noted for it later (``notes``:
        action, at, text: a Slack notice delivered) and the trigger that moved the rule."""
        return await self._call(lambda db: _history(db, rule, limit, since))

    async def run_of(self, run_id: int) -> ActionRun | None:
        """One run with its event, as the dispatcher carries runs out."""
        found = await self._call(lambda db: _runs_to_do(db, [run_id], math.inf, any_status=True))
        return found[0] if found else None

    async def action_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._call(
            lambda db: _rows(db, "SELECT * FROM action_runs ORDER BY id DESC LIMIT ?", (limit,))
        )


def _connect(path: Path, synchronous: str = "FULL") -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT)
    db.row_factory = sqlite3.Row
    _switch_to_wal(db)
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA foreign_keys=ON")
    # Checkpoint the WAL into the database every 8,000 pages (about 32 MB) rather than SQLite's
    # 1,000: a stream of small commits rewrites the same few pages, and a rarer checkpoint copies
    # each of them once instead of many times. The WAL file is kept at up to 64 MB, not cut back
    # after a checkpoint: SQLite then writes it over from the start, and syncing blocks written
    # over costs the file system about half of syncing a file that grows (no size to journal).
    db.execute("PRAGMA wal_autocheckpoint=8000")
    db.execute(f"PRAGMA journal_size_limit={64 * 2**20}")
    return db


def _switch_to_wal(db: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL``, waiting for a lock as any other statement would. Turning a new
    database to WAL takes an exclusive lock, and SQLite answers SQLITE_BUSY at once there instead of
    calling its busy handler: two processes opening a new file together (the daemon starting while
    ``specguard ladder show`` reads it) failed one of them with "database is locked"."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _open(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = _connect(path)
    with transaction(db):
        # statement by statement: executescript() would commit behind the transaction's back
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row["value"]) > SCHEMA_VERSION:
            raise RuntimeError(
                f"{path} was written by a newer specguard (schema {row['value']}); refusing to downgrade it"
            )
        elif int(row["value"]) < SCHEMA_VERSION:
            _upgrade(db, int(row["value"]))
    return db


def _upgrade(db: sqlite3.Connection, version: int) -> None:
    """Bring a database written by an older specguard up to SCHEMA_VERSION (inside the transaction)."""
    for since in range(version + 1, SCHEMA_VERSION + 1):
        for table, column in _COLUMNS_SINCE.get(since, ()):
            present = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
            if column.split()[0] not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))


class transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any failure, the commit's own included: a failed
    write (a full disk) must not leave a transaction open that every later write would trip on."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.Error:
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        if self.db.in_transaction:  # SQLite may have rolled back by itself (SQLITE_FULL does)
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")


def _update(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> None:
    db.execute(sql, params)


def _rows(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [dict(row) for row in db.execute(sql, params)]


def load_states_read_only(path: Path) -> dict[str, dict[str, SeriesState]]:
    """Every rule's series states from the database at ``path``, opened read-only (``eval``
    reads a running daemon's detectors this way, never writing). Raises sqlite3.Error."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
        db.row_factory = sqlite3.Row
        return _load_states(db)


def _load_states(db: sqlite3.Connection) -> dict[str, dict[str, SeriesState]]:
    out: dict[str, dict[str, SeriesState]] = {}
    for row in db.execute("SELECT * FROM series_state"):
        out.setdefault(row["rule"], {})[row["series"]] = SeriesState(
            labels=json.loads(row["labels"]),
            state=State(row["state"]),
            since=row["since"],
            breach_since=row["breach_since"],
            last_breach=row["last_breach"],
            consecutive=row["consecutive"],
            verdict=Verdict(row["verdict"]) if row["verdict"] else None,
            value=row["value"],
            threshold=row["threshold"],
            error=row["error"],
            last_eval=row["last_eval"],
            ok_since=row["ok_since"],
            last_data=row["last_data"],
            last_seen=row["last_seen"],
            moved_by=row["moved_by"],
            # An older database read without its upgrade (eval, read-only) has no detector column.
            detector=json.loads(row["detector"]) if "detector" in row.keys() and row["detector"] else None,  # noqa: SIM118 (a Row's `in` looks at values)
        )
    return out


def _commit(
    db: sqlite3.Connection,
    rule: str,
    states: Mapping[str, SeriesState],
    records: Sequence[EventRecord],
    forgotten: Sequence[str] | None = None,
    guard: Guard | None = None,
) -> list[int]:
    """All of the rule's states (``forgotten`` None), or these states and these deletions."""
    pending: list[int] = []
    with transaction(db):
        if forgotten is None:
            db.execute("DELETE FROM series_state WHERE rule=?", (rule,))
        else:
            db.executemany(
                "DELETE FROM series_state WHERE rule=? AND series=?", [(rule, k) for k in forgotten]
            )
        db.executemany(
            "INSERT OR REPLACE INTO series_state (rule, series, labels, state, since, breach_since, last_breach, "
            "consecutive, verdict, value, threshold, error, last_eval, ok_since, last_data, last_seen, "
            "moved_by, detector) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    rule,
                    key,
                    json.dumps(dict(s.labels), sort_keys=True),
                    s.state.value,
                    s.since,
                    s.breach_since,
                    s.last_breach,
                    s.consecutive,
                    s.verdict.value if s.verdict else None,
                    s.value,
                    s.threshold,
                    s.error,
                    s.last_eval,
                    s.ok_since,
                    s.last_data,
                    s.last_seen,
                    s.moved_by,
                    json.dumps(dict(s.detector), sort_keys=True) if s.detector is not None else None,
                )
                for key, s in states.items()
            ],
        )
        for record in records:
            e = record.event
            cursor = db.execute(
                "INSERT INTO events (at, rule, series, labels, kind, previous, value, threshold, severity, "
                "summary, annotations, shadow, dry_run, trigger, since) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    e.at,
                    e.rule,
                    e.series,
                    json.dumps(dict(e.labels), sort_keys=True),
                    e.kind.value,
                    e.previous.value,
                    e.value,
                    e.threshold,
                    record.severity,
                    record.summary,
                    json.dumps(dict(record.annotations)),
                    int(record.shadow),
                    int(record.dry_run),
                    record.trigger,
                    e.since,
                ),
            )
            event_id = cursor.lastrowid
            for planned in record.runs:
                if guard is not None and planned.status == "pending":
                    planned = guard(db, e, planned)
                run = db.execute(
                    "INSERT INTO action_runs (event_id, action, status, reason, created, mode, not_before, "
                    "admitted) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        event_id,
                        planned.action,
                        planned.status,
                        planned.reason,
                        e.at,
                        planned.mode,
                        planned.not_before,
                        e.at if planned.status == RunStatus.PENDING else None,
                    ),
                )
                if planned.status == "pending" and run.lastrowid is not None:
                    pending.append(run.lastrowid)
    return pending


def _forget(db: sqlite3.Connection, keep: set[str]) -> int:
    rules = {row["rule"] for row in db.execute("SELECT DISTINCT rule FROM series_state")}
    gone = rules - keep
    with transaction(db):
        for rule in gone:
            db.execute("DELETE FROM series_state WHERE rule=?", (rule,))
    return len(gone)


def _runs_to_do(
    db: sqlite3.Connection, ids: Sequence[int] | None, now: float, any_status: bool = False
) -> list[ActionRun]:
    sql = (
        "SELECT r.id, r.event_id, r.action, r.status, r.attempts, r.mode, e.at, e.series, e.rule, e.kind, "
        "e.labels, e.value, e.threshold, e.severity, e.summary, e.annotations, e.since FROM action_runs r "
        "JOIN events e ON e.id = r.event_id WHERE "
    )
    params: tuple[Any, ...] = ()
    if any_status:
        sql += "1"
    else:
        sql += (
            "(r.status = 'running' OR (r.status = 'pending' AND (r.not_before IS NULL OR r.not_before <= ?)))"
        )
        params = (now,)
    if ids is not None:
        if not ids:
            return []
        sql += f" AND r.id IN ({','.join('?' * len(ids))})"
        params = (*params, *ids)
    sql += " ORDER BY r.id"
    return [
        ActionRun(
            id=row["id"],
            event_id=row["event_id"],
            action=row["action"],
            status=row["status"],
            attempts=row["attempts"],
            mode=row["mode"],
            at=row["at"],
            series=row["series"],
            rule=row["rule"],
            kind=row["kind"],
            labels=json.loads(row["labels"]),
            value=row["value"],
            threshold=row["threshold"],
            severity=row["severity"],
            summary=row["summary"],
            annotations=json.loads(row["annotations"]),
            since=row["since"],
        )
        for row in db.execute(sql, params)
    ]


def _events(
    db: sqlite3.Connection, rule: str | None, limit: int, since: float | None = None
) -> list[dict[str, Any]]:
    where: list[str] = ["at >= ?"]
    params: list[Any] = [-math.inf if since is None else since]
    if rule is not None:
        where.append("rule = ?")
        params.append(rule)
    sql = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
    return _rows(db, sql, (*params, limit))


def _history(
    db: sqlite3.Connection, rule: str | None, limit: int, since: float | None
) -> list[dict[str, Any]]:
    events = _events(db, rule, limit, since)
    runs: dict[int, list[dict[str, Any]]] = {event["id"]: [] for event in events}
    notes: dict[int, list[dict[str, Any]]] = {event["id"]: [] for event in events}
    if runs:  # every run of these events in one query, not one per event
        marks = ",".join("?" * len(runs))
        for run in _rows(
            db,
            f"SELECT event_id, action, mode, status, reason, detail, attempts, not_before, finished FROM action_runs "
            f"WHERE event_id IN ({marks}) ORDER BY id",
            tuple(runs),
        ):
            runs[run.pop("event_id")].append(run)
        for note in _rows(
            db,
            f"SELECT event_id, action, at, text FROM action_notes WHERE event_id IN ({marks}) ORDER BY id",
            tuple(runs),
        ):
            notes[note.pop("event_id")].append(note)
    for event in events:
        event["labels"] = json.loads(event["labels"])
        event["annotations"] = json.loads(event["annotations"])
        event["runs"] = runs[event["id"]]
        event["notes"] = notes[event["id"]]
    return events
