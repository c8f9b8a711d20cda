"""What ``specguard tune`` recommended: one row of ``tune_results`` per finished sweep.

``specguard preflight`` holds a running server's k to the latest row for it: the recommended k, or a
k whose measured speed was within the row's ``margin`` of the best (the sweep's own tie, a relative
difference it could not tell apart). ``result`` keeps the rest as JSON: the k swept, each k's score
at the primary concurrency, the k within the margin, the per-batch-size schedule.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specguard.store.connection import transaction


@dataclass(frozen=True)
class TuneResult:
    at: float
    url: str  # the server tune measured, as --url gave it (no trailing slash)
    model: str  # its served model name
    k_running: int | None  # the k the server ran when the sweep started (restored at the end)
    recommended: int  # the k to run (the largest of the schedule when one is recommended)
    margin: float | None  # a k whose score is within this share of the best's is as good
    result: Mapping[str, Any]  # "ks", "scores", "within_margin", "schedule", "concurrency"...

    def acceptable(self) -> tuple[int, ...]:
        """The k this result accepts: the recommended one and those within its margin."""
        within = self.result.get("within_margin") or ()
        return tuple(sorted({self.recommended, *(int(k) for k in within)}))


def record(db: sqlite3.Connection, found: TuneResult) -> int:
    """Add one finished sweep; its row id."""
    with transaction(db):
        cursor = db.execute(
            "INSERT INTO tune_results (at, url, model, k_running, recommended, margin, result)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (found.at, found.url, found.model, found.k_running, found.recommended, found.margin,
             json.dumps(dict(found.result), sort_keys=True)),
        )  # fmt: skip
    return int(cursor.lastrowid or 0)


def latest(db: sqlite3.Connection) -> list[TuneResult]:
    """The newest result of each (url, model), newest first."""
    rows = db.execute(
        "SELECT at, url, model, k_running, recommended, margin, result FROM tune_results"
        " ORDER BY at DESC, id DESC"
    ).fetchall()
    seen: set[tuple[str, str]] = set()
    out = []
    for row in rows:
        key = (str(row[1]), str(row[2]))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            TuneResult(float(row[0]), key[0], key[1], None if row[3] is None else int(row[3]), int(row[4]),
                       None if row[5] is None else float(row[5]), json.loads(row[6]))
        )  # fmt: skip
    return out
