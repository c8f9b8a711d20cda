"""A rule's evaluation written in one transaction: its series states, the events they made and the
action runs planned for them (pending runs passing the guards there), and the states read back at
start."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specguard.store.connection import read_only, transaction
from specguard.store.records import Event, EventRecord, PlannedRun, RunStatus, SeriesState, State, Verdict

# Given the transaction an event is written in and a run planned for it, the run as it is to be
# written: the guards' last word, taken where no other commit can slip in between.
Guard = Callable[[sqlite3.Connection, "Event", PlannedRun], PlannedRun]


def load_states_read_only(path: Path) -> dict[str, dict[str, SeriesState]]:
    """Every rule's series states from the database at ``path``, opened read-only (``eval``
    reads a running daemon's detectors this way, never writing). Raises sqlite3.Error."""
    with contextlib.closing(read_only(path)) as db:
        return load_states(db)


def load_states(db: sqlite3.Connection) -> dict[str, dict[str, SeriesState]]:
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
            detector=_detector_of(row),
        )
    return out


def _detector_of(row: sqlite3.Row) -> dict[str, Any] | None:
    """The detector's state as the engine wrote it: its JSON, with the warm-up's windows (bytes, in
    their own column) put back. An older database read without its upgrade (eval, read-only) may
    have neither column."""
    columns = row.keys()
    if "detector" not in columns or not row["detector"]:
        return None
    detector: dict[str, Any] = json.loads(row["detector"])
    held = detector.get("held")
    if "held" in columns and row["held"] is not None and isinstance(held, dict):
        held["packed"] = bytes(row["held"])
    return detector


def stored_form(detector: Mapping[str, Any] | None) -> tuple[str | None, bytes | None]:
    """The detector's state as the store keeps it: JSON, and the warm-up's windows as they are (the
    bytes the engine packed; an hour of them is 17 KB a series, rewritten at every window, which
    JSON would copy and grow by a third)."""
    if detector is None:
        return None, None
    held = detector.get("held")
    packed = held.get("packed") if isinstance(held, Mapping) else None
    if not isinstance(packed, bytes):
        return json.dumps(dict(detector), sort_keys=True), None
    assert isinstance(held, Mapping)
    rest = {**detector, "held": {k: v for k, v in held.items() if k != "packed"}}
    return json.dumps(rest, sort_keys=True), packed


def commit(
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
            "moved_by, detector, held) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
                    *stored_form(s.detector),
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


def forget(db: sqlite3.Connection, keep: set[str]) -> int:
    rules = {row["rule"] for row in db.execute("SELECT DISTINCT rule FROM series_state")}
    gone = rules - keep
    with transaction(db):
        for rule in gone:
            db.execute("DELETE FROM series_state WHERE rule=?", (rule,))
    return len(gone)
