"""What the store is asked about its events and runs: the events with their runs and notes
(history), and the runs to carry out, each with its event."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from specguard.store.records import ActionRun


def rows(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [dict(row) for row in db.execute(sql, params)]


def runs_to_do(
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


def latest_events(
    db: sqlite3.Connection, rule: str | None, limit: int, since: float | None = None
) -> list[dict[str, Any]]:
    where: list[str] = ["at >= ?"]
    params: list[Any] = [-math.inf if since is None else since]
    if rule is not None:
        where.append("rule = ?")
        params.append(rule)
    sql = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
    return rows(db, sql, (*params, limit))


def history(
    db: sqlite3.Connection, rule: str | None, limit: int, since: float | None
) -> list[dict[str, Any]]:
    events = latest_events(db, rule, limit, since)
    runs: dict[int, list[dict[str, Any]]] = {event["id"]: [] for event in events}
    notes: dict[int, list[dict[str, Any]]] = {event["id"]: [] for event in events}
    if runs:  # every run of these events in one query, not one per event
        marks = ",".join("?" * len(runs))
        for run in rows(
            db,
            f"SELECT event_id, action, mode, status, reason, detail, attempts, not_before, finished FROM action_runs "
            f"WHERE event_id IN ({marks}) ORDER BY id",
            tuple(runs),
        ):
            runs[run.pop("event_id")].append(run)
        for note in rows(
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
