"""The fallback drills (``specguard preflight --drill``), as the store keeps them: one row per drill,
written as ``running`` before the flag is touched and finished with its outcome, so a drill cut
short (the process killed) is still on record, unfinished. Read by ``specguard history --drills``
and by the checklist's item 7 (the last drill's age)."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from typing import Any

from specguard.store.connection import transaction

RUNNING = "running"
PASSED = "passed"
FAILED = "failed"  # the fallback did not do its job: engage, traffic moved, canary, restore
REFUSED = "refused"  # not started: the flag was held, engaged, or could not be drilled safely
HANDED_OVER = "handed_over"  # a rule (or a ladder) took the flag over during the drill: left to the daemon
INTERRUPTED = "interrupted"  # cut short (Ctrl-C, a timeout, the process killed)
OUTCOMES = (RUNNING, PASSED, FAILED, REFUSED, HANDED_OVER, INTERRUPTED)
# The outcomes that say whether the fallback works: what "the last drill" means for item 7.
TELLING = (PASSED, FAILED)


@dataclass(frozen=True)
class Drill:
    id: int
    started: float
    finished: float | None
    action: str
    outcome: str
    detail: str
    evidence: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "started": self.started,
            "finished": self.finished,
            "action": self.action,
            "outcome": self.outcome,
            "detail": self.detail,
            "evidence": list(self.evidence),
        }


def _drill(row: sqlite3.Row) -> Drill:
    try:
        evidence = json.loads(row["evidence"])
    except ValueError:
        evidence = [str(row["evidence"])]
    return Drill(
        int(row["id"]),
        float(row["started"]),
        None if row["finished"] is None else float(row["finished"]),
        str(row["action"]),
        str(row["outcome"]),
        str(row["detail"]),
        tuple(str(line) for line in evidence) if isinstance(evidence, list) else (str(evidence),),
    )


def start(db: sqlite3.Connection, action: str, at: float) -> int:
    """A drill begins: its row, ``running``; its id."""
    with transaction(db):
        cursor = db.execute(
            "INSERT INTO drills (started, action, outcome, detail, evidence) VALUES (?, ?, ?, '', '[]')",
            (at, action, RUNNING),
        )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def finish(
    db: sqlite3.Connection, drill: int, at: float, outcome: str, detail: str, evidence: list[str]
) -> None:
    assert outcome in OUTCOMES and outcome != RUNNING, outcome
    with transaction(db):
        db.execute(
            "UPDATE drills SET finished = ?, outcome = ?, detail = ?, evidence = ? WHERE id = ?",
            (at, outcome, detail, json.dumps(evidence), drill),
        )


def latest(
    db: sqlite3.Connection,
    limit: int,
    since: float | None = None,
    action: str | None = None,
    outcomes: tuple[str, ...] | None = None,
) -> list[Drill]:
    """The newest drills first (of ``action``, with one of ``outcomes``, started since ``since``)."""
    where: list[str] = ["started >= ?"]
    params: list[Any] = [-math.inf if since is None else since]
    if action is not None:
        where.append("action = ?")
        params.append(action)
    if outcomes is not None:
        where.append(f"outcome IN ({','.join('?' * len(outcomes))})")
        params.extend(outcomes)
    sql = f"SELECT * FROM drills WHERE {' AND '.join(where)} ORDER BY started DESC, id DESC LIMIT ?"
    return [_drill(row) for row in db.execute(sql, (*params, limit))]
