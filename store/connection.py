"""Connections to the database file: opened in WAL mode and brought to the current schema, and
``transaction``, the BEGIN IMMEDIATE ... COMMIT every write goes through."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

from specguard.store.schema import SCHEMA, SCHEMA_VERSION, upgrade

BUSY_TIMEOUT = 5.0  # seconds a statement waits for another connection's lock


def read_only(path: Path, timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    """The database at ``path`` opened read-only, its rows by name: how a command reads a running
    daemon's database (or one owned by its user) without ever changing it. The path goes in as a
    ``file:`` URI, quoted, so a name with ``?``, ``#`` or ``%`` opens that file. Raises
    sqlite3.Error."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout)
    db.row_factory = sqlite3.Row
    return db


def connect(path: Path, synchronous: str = "FULL") -> sqlite3.Connection:
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


def open_database(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = connect(path)
    with transaction(db):
        # statement by statement: executescript() would commit behind the transaction's back
        for statement in SCHEMA.split(";"):
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
            upgrade(db, int(row["value"]))
    return db


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
