"""History for reports: per-minute rollups of every catalog signal, per vLLM server and model.

Each scrape of a target is compared with the one before it: every counter's increase (reset-aware,
per raw series, as Prometheus's ``increase`` counts) is added to the minute the scrape falls in,
summed over the labels a report does not need (engine, finish reason) and kept apart where it does
(draft position, histogram bucket). Gauges add their sample sum and count (and keep their maximum),
so a window's average is the average of every sample in it. A report over any window is then the
sum of its minutes: exact for counters and histograms, whatever the window.

The tables are in the store (``store/database.py``). One row per (server and model, minute). Its values are a JSON list in the order of a *layout*, the
list of component names, stored once and shared by every row with the same components, and the
list is compressed: a minute of a server costs about 150 bytes.

Each scrape's increase and the scrape itself (the reference for the next increase) are written in
one transaction, so a daemon killed between two scrapes loses nothing: the next one, after a
restart, is compared with the last one stored. What vLLM counted while the daemon was not looking
(longer than ``SPREAD_AFTER``) is spread evenly over the minutes it missed, up to ``SPREAD_MOST``:
added to the first minute after it, a day's requests would read as one minute's, and inflate that
day's rates. A longer gap's counts are not kept (said in a warning); when they were made is unknown.

The router's series (``rules/router_signals.py``) are kept per traffic class and pool, in components
named by ``route_key``: ``route:n:<pool>:<class>`` (requests), ``route:le=<le>:<pool>:<class>``,
``route:sum:...`` and ``route:count:...`` (the request-duration histogram), and ``malformed:<reason>``.
The router's page has no ``model_name``: its history is the series (router's instance, "").

Beside the drafts, each minute counts them by the k they were made with (``drafts:k=N``, N the
per-position series the server had): a week with a ladder step holds drafts of two k, and position
i's rate is over the drafts that had a position i.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specguard.rules import router_signals as router
from specguard.rules import signals as catalog
from specguard.store.connection import transaction
from specguard.store.exposition import Labels, Snapshot

log = logging.getLogger("specguard.history")

MINUTE = 60
HOUR = 3600
MINUTES = "minutes"  # in an hour's row: how many minute rows it sums
DRAFTS_BY_K = "drafts:k="  # drafts:k=5: the drafts made while the server had 5 positions

# Gaps between two scrapes of a server: up to SPREAD_AFTER, the increase goes to the minute of the
# later scrape (two minutes cover a scrape interval of up to a minute and a late scrape); beyond
# it, over the minutes of the gap; beyond SPREAD_MOST, it is not kept.
SPREAD_AFTER = 2 * MINUTE
SPREAD_MOST = 24 * HOUR


# Counters: sample name -> component name (the position of the per-position counter is appended).
_COUNTERS: dict[catalog.Metric, str] = {
    catalog.SPEC_ACCEPTED: "accepted",
    catalog.SPEC_DRAFT_TOKENS: "draft_tokens",
    catalog.SPEC_DRAFTS: "drafts",
    catalog.SPEC_ACCEPTED_PER_POS: "pos",
    catalog.GENERATION_TOKENS: "generation_tokens",
    catalog.REQUEST_SUCCESS: "requests",
    catalog.PREEMPTIONS: "preemptions",
}
HISTOGRAMS: dict[catalog.Metric, str] = {
    catalog.E2E_LATENCY: "e2e",
    catalog.TTFT: "ttft",
    catalog.ITL: "itl",
}
# Gauges and how a server's engines combine at one scrape: the fullest engine, or the total.
_GAUGES: dict[catalog.Metric, tuple[str, str]] = {
    catalog.KV_CACHE: ("kv", "max"),
    catalog.RUNNING: ("running", "sum"),
    catalog.WAITING: ("waiting", "sum"),
}

ROUTE = "route:"
MALFORMED = "malformed:"
_ROUTE_SAMPLES: dict[str, str] = {name: "n" for name in router.ROUTE_REQUESTS.names} | {
    name + suffix: suffix[1:]
    for name in router.ROUTE_DURATION.names
    for suffix in ("_bucket", "_sum", "_count")
}
_MALFORMED_COUNTERS = frozenset(router.ROUTE_MALFORMED.names)

_COUNTER_SAMPLES: dict[str, str] = {name: part for m, part in _COUNTERS.items() for name in m.names}
_HISTOGRAM_SAMPLES: dict[str, tuple[str, str]] = {
    name + suffix: (part, suffix) for m, part in HISTOGRAMS.items() for name in m.names
    for suffix in ("_bucket", "_sum", "_count")
}  # fmt: skip
_GAUGE_SAMPLES: dict[str, tuple[str, str]] = {name: g for m, g in _GAUGES.items() for name in m.names}

Components = dict[str, float]


def route_key(part: str, pool: str, cls: str) -> str:
    """The component of the router's ``part`` (n, sum, count, le=<le>) for one pool and class."""
    return f"{ROUTE}{part}:{pool}:{cls}"


def route_parts(key: str) -> tuple[str, str, str] | None:
    """(part, pool, class) of a ``route_key`` component, or None for any other component. A pool's
    name has no colon (an nginx upstream's); a class's may."""
    if not key.startswith(ROUTE):
        return None
    fields = key.split(":", 3)
    return (fields[1], fields[2], fields[3]) if len(fields) == 4 else None


def component(sample: str, labels: Mapping[str, str]) -> str | None:
    """The component a counter sample adds to, or None when history does not keep it."""
    route = _ROUTE_SAMPLES.get(sample)
    if route is not None:
        what = f"le={labels.get('le', '')}" if route == "bucket" else route
        return route_key(what, labels.get("pool", ""), labels.get("class", ""))
    if sample in _MALFORMED_COUNTERS:
        return f"{MALFORMED}{labels.get('reason', '')}"
    part = _COUNTER_SAMPLES.get(sample)
    if part is not None:
        return f"pos:{labels.get('position', '')}" if part == "pos" else part
    histogram = _HISTOGRAM_SAMPLES.get(sample)
    if histogram is not None:
        part, suffix = histogram
        return f"{part}:le={labels.get('le', '')}" if suffix == "_bucket" else f"{part}:{suffix[1:]}"
    return None


def increases(previous: Snapshot, current: Snapshot) -> dict[str, Components]:
    """Each model's counter increases from ``previous`` to ``current`` (one target's scrapes).

    Per raw series, as Prometheus's ``increase``: a value below the previous one is a restart from
    0, so its whole value is the increase. A series the previous scrape lacked has no increase yet.
    The drafts are also counted under the k the server had (``drafts:k=N``).
    """
    out: dict[str, Components] = {}
    k = _positions(current)
    for sample, series in current.items():
        before = previous.get(sample)
        if before is None:
            continue
        for labels, value in series.items():
            last = before.get(labels)
            if last is None or not (math.isfinite(value) and math.isfinite(last)):
                continue  # new, or a value no counter has (the source reports it as an error)
            named = dict(labels)
            key = component(sample, named)
            if key is None:
                continue
            grown = value if value < last else value - last
            if grown:
                model = named.get("model_name", "")
                parts = out.setdefault(model, {})
                parts[key] = parts.get(key, 0.0) + grown
                if key == "drafts" and k.get(model):
                    by_k = f"{DRAFTS_BY_K}{k[model]}"
                    parts[by_k] = parts.get(by_k, 0.0) + grown
    return out


def _positions(snapshot: Snapshot) -> dict[str, int]:
    """Each model's draft positions (num_speculative_tokens): vLLM creates one per-position series
    per position at startup, so a server's positions are there before any draft reached them."""
    seen: dict[str, set[str]] = {}
    for name in catalog.SPEC_ACCEPTED_PER_POS.names:
        for labels in snapshot.get(name, {}):
            named = dict(labels)
            seen.setdefault(named.get("model_name", ""), set()).add(named.get("position", ""))
    return {model: len(found) for model, found in seen.items()}


def gauges(snapshot: Snapshot) -> dict[str, Components]:
    """Each model's gauge readings at one scrape, as components to add: sum, count and maximum."""
    combined: dict[tuple[str, str], list[float]] = {}
    how: dict[str, str] = {}
    for sample, series in snapshot.items():
        gauge = _GAUGE_SAMPLES.get(sample)
        if gauge is None:
            continue
        part, combine = gauge
        how[part] = combine
        for labels, value in series.items():
            if math.isfinite(value):
                combined.setdefault((dict(labels).get("model_name", ""), part), []).append(value)
    out: dict[str, Components] = {}
    for (model, part), values in combined.items():
        value = max(values) if how[part] == "max" else sum(values)
        parts = out.setdefault(model, {})
        parts[f"{part}:sum"] = value
        parts[f"{part}:n"] = 1.0
        parts[f"max:{part}"] = value
    return out


def merge(into: Components, more: Mapping[str, float]) -> Components:
    """``into`` plus ``more``: sums, except the ``max:`` components, which keep the larger."""
    for key, value in more.items():
        if key.startswith("max:"):
            into[key] = max(into.get(key, -math.inf), value)
        else:
            into[key] = into.get(key, 0.0) + value
    return into


# --- the tables -----------------------------------------------------------------------------------


def _encode_snapshot(snapshot: Snapshot) -> str:
    return json.dumps({name: [[list(map(list, labels)), value] for labels, value in series.items()]
                       for name, series in snapshot.items()})  # fmt: skip


def _decode_snapshot(text: str) -> dict[str, dict[Labels, float]]:
    raw: dict[str, list[Any]] = json.loads(text)
    return {
        name: {tuple((str(k), str(v)) for k, v in labels): float(value) for labels, value in series}
        for name, series in raw.items()
    }


def _number(value: float) -> float | int:
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


@dataclass
class Tables:
    """The history tables on one connection (used on the store's writer thread only)."""

    db: sqlite3.Connection
    _series: dict[tuple[str, str], int] = field(default_factory=dict)
    _layouts: dict[tuple[str, ...], int] = field(default_factory=dict)
    _keys: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def series_id(self, instance: str, model: str) -> int:
        key = (instance, model)
        if key not in self._series:
            self.db.execute(
                "INSERT OR IGNORE INTO history_series (instance, model) VALUES (?, ?)", (instance, model)
            )
            row = self.db.execute(
                "SELECT id FROM history_series WHERE instance=? AND model=?", (instance, model)
            ).fetchone()
            self._series[key] = int(row[0])
        return self._series[key]

    def layout_id(self, keys: tuple[str, ...]) -> int:
        if keys not in self._layouts:
            text = json.dumps(keys)
            self.db.execute("INSERT OR IGNORE INTO history_layouts (keys) VALUES (?)", (text,))
            row = self.db.execute("SELECT id FROM history_layouts WHERE keys=?", (text,)).fetchone()
            self._layouts[keys] = int(row[0])
            self._keys[int(row[0])] = keys
        return self._layouts[keys]

    def keys(self, layout: int) -> tuple[str, ...]:
        if layout not in self._keys:
            row = self.db.execute("SELECT keys FROM history_layouts WHERE id=?", (layout,)).fetchone()
            self._keys[layout] = tuple(json.loads(row[0]))
        return self._keys[layout]

    def decode(self, layout: int, data: bytes) -> Components:
        values = json.loads(zlib.decompress(data))
        return dict(zip(self.keys(layout), (float(v) for v in values), strict=True))

    def _merge(self, table: str, column: str, series: int, at: int, parts: Mapping[str, float]) -> bool:
        """Add ``parts`` to one row of ``table``; whether the row was there before."""
        row = self.db.execute(
            f"SELECT layout, data FROM {table} WHERE series=? AND {column}=?", (series, at)
        ).fetchone()
        total = merge(self.decode(row[0], row[1]) if row else {}, parts)
        keys = tuple(sorted(total))
        data = zlib.compress(json.dumps([_number(total[k]) for k in keys], separators=(",", ":")).encode())
        self.db.execute(
            f"INSERT OR REPLACE INTO {table} (series, {column}, layout, data) VALUES (?, ?, ?, ?)",
            (series, at, self.layout_id(keys), data),
        )
        return row is not None

    def add(self, series: int, minute: int, parts: Mapping[str, float]) -> None:
        """Add ``parts`` to the row of ``series`` and ``minute``, and to its hour's."""
        known = self._merge("history", "minute", series, minute, parts)
        self._merge(
            "history_hours",
            "hour",
            series,
            minute - minute % HOUR,
            parts if known else {**parts, MINUTES: 1.0},
        )

    def last(self, instance: str) -> tuple[float, dict[str, dict[Labels, float]]] | None:
        row = self.db.execute(
            "SELECT at, snapshot FROM history_last WHERE instance=?", (instance,)
        ).fetchone()
        return (float(row[0]), _decode_snapshot(row[1])) if row else None


def record(db: sqlite3.Connection, scrapes: Iterable[tuple[str, float, Snapshot]]) -> int:
    """Add each (instance, time, snapshot) scrape to history, in one transaction; the rows touched.

    A scrape no newer than the last one recorded for its instance is skipped (it was counted).
    """
    tables = Tables(db)
    touched = 0
    with transaction(db):
        for instance, at, snapshot in scrapes:
            last = tables.last(instance)
            if last is not None and at <= last[0]:
                continue
            minute = int(at // MINUTE) * MINUTE
            per_model = gauges(snapshot)
            if last is not None:
                grown = increases(last[1], snapshot)
                gap = at - last[0]
                if gap <= SPREAD_AFTER:
                    for model, parts in grown.items():
                        merge(per_model.setdefault(model, {}), parts)
                elif gap <= SPREAD_MOST:
                    for model, parts in grown.items():
                        series = tables.series_id(instance, model)
                        for start, share in _shares(last[0], at):
                            tables.add(series, start, {key: value * share for key, value in parts.items()})
                            touched += 1
                elif grown:
                    log.warning(
                        "history of %s: %s since its last scrape; what the server counted meanwhile is "
                        "not kept (when it was counted is unknown)",
                        instance,
                        _hours(gap),
                    )
            for model, parts in per_model.items():
                tables.add(tables.series_id(instance, model), minute, parts)
                touched += 1
            reference = _carried(snapshot, last[1] if last is not None else {})
            db.execute(
                "INSERT OR REPLACE INTO history_last (instance, at, snapshot) VALUES (?, ?, ?)",
                (instance, at, _encode_snapshot(reference)),
            )
    return touched


def _shares(start: float, end: float) -> list[tuple[int, float]]:
    """The minutes ``(start, end]`` covers and the share of it each holds."""
    out = []
    minute = int(start // MINUTE) * MINUTE
    while minute < end:
        covered = min(end, minute + MINUTE) - max(start, minute)
        if covered > 0:
            out.append((minute, covered / (end - start)))
        minute += MINUTE
    return out


def _hours(seconds: float) -> str:
    return f"{seconds / HOUR:.1f} h"


def _carried(snapshot: Snapshot, before: Snapshot) -> dict[str, dict[Labels, float]]:
    """``snapshot`` as the next scrape's reference: a sample that is not a number keeps the value it
    had before (or is left out), so the next real value's increase is counted from that one."""
    out: dict[str, dict[Labels, float]] = {}
    for name, series in snapshot.items():
        kept: dict[Labels, float] = {}
        for labels, value in series.items():
            if math.isfinite(value):
                kept[labels] = value
            else:
                previous = before.get(name, {}).get(labels)
                if previous is not None and math.isfinite(previous):
                    kept[labels] = previous
        out[name] = kept
    return out


@dataclass(frozen=True)
class Span:
    """A minute, or a whole hour (the sum of its minutes), of one server and model."""

    start: int  # epoch seconds
    minutes: int  # how many minutes of history it holds
    parts: Components


def read(
    db: sqlite3.Connection, start: float, end: float, hours: bool = True
) -> dict[tuple[str, str], list[Span]]:
    """Every (instance, model)'s history in ``[start, end)``, oldest first: the whole hours inside it
    as hour rows (``hours``), the minutes at its edges as minute rows. Exactly the sum of its minutes
    either way; a week is about 170 rows per server instead of 10,080."""
    tables = Tables(db)
    names = {
        int(r[0]): (str(r[1]), str(r[2]))
        for r in db.execute("SELECT id, instance, model FROM history_series")
    }
    first, last = math.ceil(start / HOUR) * HOUR, math.floor(end / HOUR) * HOUR
    if not hours or first >= last:
        first = last = math.ceil(end)  # no whole hour: minutes only
    out: dict[tuple[str, str], list[Span]] = {}
    rows = db.execute(
        "SELECT series, minute, 0, layout, data FROM history"
        " WHERE (minute >= ? AND minute < ?) OR (minute >= ? AND minute < ?)"
        " UNION ALL SELECT series, hour, 1, layout, data FROM history_hours WHERE hour >= ? AND hour < ?"
        " ORDER BY 1, 2",
        (math.ceil(start), first, last, math.ceil(end), first, last),
    )
    for series, at, whole, layout, data in rows:
        parts = tables.decode(layout, data)
        count = int(parts.pop(MINUTES, 0)) if whole else 1
        out.setdefault(names[int(series)], []).append(Span(int(at), count, parts))
    return out


def prune(db: sqlite3.Connection, before: float, max_bytes: int) -> int:
    """Delete the minutes older than ``before`` (and the hours wholly older), then the oldest ones
    until history holds at most ``max_bytes`` (its rows' sizes); the number of minutes deleted."""
    with transaction(db):
        deleted = db.execute("DELETE FROM history WHERE minute < ?", (int(before),)).rowcount
        db.execute("DELETE FROM history_hours WHERE hour + ? <= ?", (HOUR, int(before)))
        estimate, rows = _size(db)
        cut = None
        while estimate > max_bytes and rows:
            # Drop the oldest whole minutes, the share of rows over the bound (hour rows go with
            # their last minute, so a second pass may be needed).
            excess = min(rows, math.ceil(rows * (estimate - max_bytes) / estimate) + 1)
            cut = int(
                db.execute(
                    "SELECT minute FROM history ORDER BY minute LIMIT 1 OFFSET ?", (excess - 1,)
                ).fetchone()[0]
            )
            deleted += db.execute("DELETE FROM history WHERE minute <= ?", (cut,)).rowcount
            db.execute("DELETE FROM history_hours WHERE hour + ? <= ?", (HOUR, cut + MINUTE))
            estimate, rows = _size(db)
        if cut is not None:
            log.warning("history is over its %d-byte bound: minutes up to %d dropped", max_bytes, cut)
    return int(deleted)


ROW_OVERHEAD = 24  # bytes SQLite spends per row beside the data (key, layout, cell header)


def _size(db: sqlite3.Connection) -> tuple[int, int]:
    total, rows = 0, 0
    for table in ("history", "history_hours"):
        data, count = db.execute(f"SELECT COALESCE(SUM(length(data)), 0), COUNT(*) FROM {table}").fetchone()
        total += int(data) + ROW_OVERHEAD * int(count)
        rows += int(count) if table == "history" else 0
    return total, rows


def size(db: sqlite3.Connection) -> int:
    """The bytes history's rows take (data plus the per-row overhead), the figure ``prune`` bounds."""
    return _size(db)[0]
