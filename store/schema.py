"""The database's shape: its tables and indexes (DDL), the schema version, and the upgrade that
brings a database written by an older specguard up to date."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 9
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
    # A detector's warm-up windows, packed (they were base64 in the detector's JSON before).
    9: (("series_state", "held BLOB"),),
}
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series_state (
    rule TEXT NOT NULL, series TEXT NOT NULL, labels TEXT NOT NULL, state TEXT NOT NULL,
    since REAL, breach_since REAL, last_breach REAL, consecutive INTEGER NOT NULL,
    verdict TEXT, value REAL, threshold REAL, error TEXT, last_eval REAL,
    ok_since REAL, last_data REAL, last_seen REAL, moved_by TEXT, detector TEXT, held BLOB,
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
-- History for reports (store/history.py): per-minute rollups per vLLM server and model.
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
-- What `specguard tune` recommended, one row per finished sweep: preflight holds the running k to it.
CREATE TABLE IF NOT EXISTS tune_results (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, url TEXT NOT NULL, model TEXT NOT NULL,
    k_running INTEGER, recommended INTEGER NOT NULL, margin REAL, result TEXT NOT NULL
);
-- Fallback drills (`specguard preflight --drill`): engaged, traffic seen moving, restored. A row is
-- written as `running` before the flag is touched and finished with its outcome (passed, failed,
-- refused, handed_over, interrupted), the one-line reason and the evidence (a JSON list of lines).
CREATE TABLE IF NOT EXISTS drills (
    id INTEGER PRIMARY KEY AUTOINCREMENT, started REAL NOT NULL, finished REAL, action TEXT NOT NULL,
    outcome TEXT NOT NULL, detail TEXT NOT NULL, evidence TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS drills_started ON drills (started);
"""


def upgrade(db: sqlite3.Connection, version: int) -> None:
    """Bring a database written by an older specguard up to SCHEMA_VERSION (inside the transaction)."""
    for since in range(version + 1, SCHEMA_VERSION + 1):
        for table, column in _COLUMNS_SINCE.get(since, ()):
            present = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
            if column.split()[0] not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
