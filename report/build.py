"""Assemble a report (``report.model``) from the store: history's figures and what the daemon did.

Runs on the store's writer thread (``Store.call``): one read of history per week, then the events,
action runs, flag engagements, rung changes and silences of the period.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from specguard.metrics import figures as fig
from specguard.report.model import HEADLINE, LATENCY, VERSION, Report, headline
from specguard.report.traffic import Pools, is_router, traffic
from specguard.store import history
from specguard.store.baseline import Baseline
from specguard.store.history import Span

# Per-day, per-hour and hour-by-hour figures: the acceptance family.
_ACCEPTANCE = ("acceptance_rate", "mean_acceptance_length", "estimated_speedup", "drafts")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(
    db: sqlite3.Connection,
    start: float,
    end: float,
    *,
    baseline: Baseline | None,
    host: str,
    now: float,
    charts_missing: str | None = None,
    remedies: Collection[str] = (),
    pools: Pools | None = None,
) -> Report:
    """The report of ``[start, end)``, with the same span before it for week-over-week change.
    ``remedies``: the actions that change the world (a fallback, a restart), whose run is what a
    firing's time to act waits for when it had one. ``pools``: the router's pools and their
    servers (``host:port``), for the acceptance of the pool each traffic class went to."""
    span = end - start
    current = history.read(db, start, end)
    previous = history.read(db, start - span, start)
    routed = traffic(current, pools)
    # The router's series are not servers: they are the traffic by class, not a section each.
    current = {key: spans for key, spans in current.items() if not is_router(spans)}
    previous = {key: spans for key, spans in previous.items() if not is_router(spans)}
    series = [
        _series(instance, model, current.get((instance, model), []), previous.get((instance, model), []),
                baseline, db)
        for instance, model in sorted(set(current) | set(previous))
    ]  # fmt: skip
    now_labels, before_labels = _firing_labels(db, start, end), _firing_labels(db, start - span, start)
    for item in series:
        item["headline"]["firings"] = headline(
            float(_count_of(now_labels, item["instance"], item["model"])),
            float(_count_of(before_labels, item["instance"], item["model"])),
        )
    from specguard.report.recommend import recommendations

    return {
        "specguard_report": VERSION,
        "generated_at": iso(now),
        "host": host,
        "period": {"from": iso(start), "to": iso(end), "seconds": span},
        "previous_period": {"from": iso(start - span), "to": iso(start)},
        "series": series,
        "rules": _rules(db, start, end, frozenset(remedies), _fired(db, start - span, start)),
        "fallbacks": {
            **_fallbacks(db, start, end, now),
            "previous": {k: v for k, v in _fallbacks(db, start - span, start, now).items() if k != "spans"},
        },
        "restarts": _restarts(db, start, end),
        "silences": _silences(db, start, end),
        "traffic": routed,
        "recommendations": recommendations(series),
        "charts": {"available": charts_missing is None, "missing": charts_missing},
    }


def _cost(baseline: Baseline | None, labels: Mapping[str, str]) -> tuple[float | None, str]:
    if baseline is None:
        return None, "no baseline file: set `baseline` in the config (specguard bench --write-baseline)"
    cost = baseline.draft_cost(labels)
    if isinstance(cost, str):
        return None, cost
    entry = baseline.entry_for(labels)
    spec = getattr(entry, "speculative", None)
    given = spec is not None and spec.draft_cost is not None
    how = "draft_cost" if given else f"the default for method {getattr(spec, 'method', None)}"
    return cost, f"baseline: {how}"


def _grouped(spans: Iterable[Span], key: Callable[[int], Any]) -> dict[Any, list[Span]]:
    out: dict[Any, list[Span]] = {}
    for span in spans:  # a span is a minute or a whole hour: it falls in one day and one hour
        out.setdefault(key(span.start), []).append(span)
    return out


def _acceptance(minutes: list[Span], cost: float | None) -> dict[str, Any]:
    parts, count = fig.total(minutes)
    figures = fig.figures(parts, count, cost)
    return {name: figures[name] for name in _ACCEPTANCE}


def _k_at_end(db: sqlite3.Connection, instance: str, model: str, spans: list[Span]) -> int | None:
    """The k the server had at the period's end: that of its newest drafts. When a ladder step fell
    inside the newest hour with drafts, that hour's minutes tell which k came last."""
    for span in reversed(spans):
        by_k = fig.drafts_by_k(span.parts)
        if len(by_k) > 1 and span.minutes > 1:
            minutes = history.read(db, span.start, span.start + history.HOUR, hours=False)
            return _k_at_end(db, instance, model, minutes.get((instance, model), []))
        if by_k:
            return max(by_k)  # one k; or two in one minute, which history cannot order
    return None


def _series(
    instance: str,
    model: str,
    minutes: list[Span],
    before: list[Span],
    baseline: Baseline | None,
    db: sqlite3.Connection,
) -> dict[str, Any]:
    labels = {"instance": instance, "model_name": model}
    cost, cost_source = _cost(baseline, labels)
    parts, count = fig.total(minutes)
    previous_parts, previous_count = fig.total(before)
    now_figures = fig.figures(parts, count, cost)
    then_figures = fig.figures(previous_parts, previous_count, cost)
    k = _k_at_end(db, instance, model, minutes) or fig.positions(parts) or None
    k_previous = _k_at_end(db, instance, model, before) or fig.positions(previous_parts) or None
    by_k = fig.drafts_by_k(parts)
    day = _grouped(minutes, lambda m: datetime.fromtimestamp(m, UTC).strftime("%Y-%m-%d"))
    hour = _grouped(minutes, lambda m: datetime.fromtimestamp(m, UTC).hour)
    hourly = _grouped(minutes, lambda m: m - m % 3600)
    latency = []
    for name in LATENCY:
        value = now_figures[name]
        known = baseline.value(labels, name) if baseline is not None else None
        base = known if isinstance(known, float | int) else None
        ratio = value / base if value is not None and base else None
        latency.append({"signal": name, "value": value, "baseline": base, "ratio": ratio})
    return {
        "instance": instance,
        "model": model,
        "k": k,
        "k_previous": k_previous,
        # the share of the period's drafts made with each k, when a ladder step changed it
        "k_share": {str(n): made / sum(by_k.values()) for n, made in sorted(by_k.items())}
        if len(by_k) > 1
        else None,
        "draft_cost": cost,
        "draft_cost_source": cost_source,
        "minutes": count,
        "headline": {name: headline(now_figures[name], then_figures[name]) for name in HEADLINE},
        "per_position": fig.per_position(parts),
        "by_day": [{"day": d, **_acceptance(m, cost)} for d, m in sorted(day.items())],
        "by_hour_of_day": [{"hour": h, **_acceptance(m, cost)} for h, m in sorted(hour.items())],
        "hourly": [{"at": iso(h), **_acceptance(m, cost)} for h, m in sorted(hourly.items())],
        "latency": latency,
    }


_FIRINGS = "FROM events WHERE kind='firing' AND shadow=0 AND at >= ? AND at < ?"


def _fired(db: sqlite3.Connection, start: float, end: float) -> dict[str, int]:
    """How many times each rule fired in ``[start, end)``."""
    rows = db.execute(f"SELECT rule, COUNT(*) {_FIRINGS} GROUP BY rule", (start, end))
    return {str(rule): int(count) for rule, count in rows}


def _firing_labels(db: sqlite3.Connection, start: float, end: float) -> list[dict[str, str]]:
    return [json.loads(row[0]) for row in db.execute(f"SELECT labels {_FIRINGS}", (start, end))]


def _count_of(labels: list[dict[str, str]], instance: str, model: str) -> int:
    """The firings whose series is this server's and model's (a rule over every model of a server
    counts for each of them; one that names neither, for none)."""
    return sum(
        1 for named in labels if named.get("instance") == instance and named.get("model_name", model) == model
    )


def _rules(
    db: sqlite3.Connection,
    start: float,
    end: float,
    remedies: frozenset[str],
    fired_before: Mapping[str, int],
) -> list[dict[str, Any]]:
    """Each rule that fired in the period: its firings, what each said and when it resolved (and
    what that said), and the time from the breach's start to the first remedy that did its work
    (the time users waited for it), or to the first action of any kind when the rule has no remedy
    (a log line, a notice); and how many times it fired in the period before."""
    firings = db.execute(
        f"SELECT id, at, rule, series, severity, value, since, summary {_FIRINGS} ORDER BY at", (start, end)
    ).fetchall()
    rules: dict[str, dict[str, Any]] = {}
    for row in firings:
        resolution = db.execute(
            "SELECT at, summary FROM events WHERE rule=? AND series=? AND kind='resolved' AND at > ?"
            " ORDER BY at LIMIT 1",
            (row["rule"], row["series"], row["at"]),
        ).fetchone()
        resolved = resolution["at"] if resolution is not None else None
        done = db.execute(
            "SELECT action, finished FROM action_runs WHERE event_id=? AND status='ok' AND mode='run'"
            " ORDER BY finished",
            (row["id"],),
        ).fetchall()
        first = next((r for r in done if r["action"] in remedies), done[0] if done else None)
        acted = first["finished"] if first is not None else None
        began = row["since"] if row["since"] is not None else row["at"]
        entry = rules.setdefault(
            row["rule"],
            {"rule": row["rule"], "severity": row["severity"], "fired": 0, "resolved": 0, "firings": []},
        )
        entry["fired"] += 1
        entry["resolved"] += resolved is not None
        entry["firings"].append(
            {
                "at": iso(row["at"]),
                "since": iso(began),
                "series": row["series"],
                "value": row["value"],
                "message": row["summary"],
                "resolved_at": iso(resolved) if resolved is not None else None,
                "resolved_message": resolution["summary"] if resolution is not None else None,
                "time_to_act": acted - began if acted is not None else None,
                "acted_by": first["action"] if first is not None else None,
            }
        )
    for entry in rules.values():
        waits = [f["time_to_act"] for f in entry["firings"] if f["time_to_act"] is not None]
        entry["median_time_to_act"] = statistics.median(waits) if waits else None
        entry["fired_previous"] = fired_before.get(entry["rule"], 0)
    return sorted(rules.values(), key=lambda e: (-e["fired"], e["rule"]))


def _memories(db: sqlite3.Connection, key: str) -> list[tuple[str, dict[str, Any]]]:
    rows = db.execute("SELECT action, value FROM action_memory WHERE key=? ORDER BY action", (key,))
    return [(str(r["action"]), json.loads(r["value"])) for r in rows]


def _fallbacks(db: sqlite3.Connection, start: float, end: float, now: float) -> dict[str, Any]:
    """Each feature flag's engagements that overlap the period, the time each spent engaged inside
    it (one still engaged counts until the report's end or now), and how many began in it."""
    spans = []
    for action, memory in _memories(db, "flag"):
        for span in memory.get("spans") or []:
            engaged, restored = float(span["engaged"]), span.get("restored")
            stop = float(restored) if restored is not None else min(now, end)
            if engaged >= end or stop <= start:
                continue
            spans.append(
                {
                    "action": action,
                    "engaged": iso(engaged),
                    "restored": iso(float(restored)) if restored is not None else None,
                    "seconds": min(stop, end) - max(engaged, start),
                    "began_in_period": engaged >= start,
                }
            )
    spans.sort(key=lambda s: str(s["engaged"]))
    return {
        "count": sum(1 for s in spans if s["began_in_period"]),
        "seconds": sum(s["seconds"] for s in spans),
        "spans": spans,
    }


def _restarts(db: sqlite3.Connection, start: float, end: float) -> list[dict[str, Any]]:
    out = []
    for action, memory in _memories(db, "ladder"):
        for entry in memory.get("log") or []:
            if start <= float(entry["at"]) < end:
                out.append(
                    {
                        "at": iso(float(entry["at"])),
                        "action": action,
                        "status": "ok" if entry.get("ok") else "failed",
                        "k_from": entry.get("from"),
                        "k_to": entry.get("to"),
                        "reason": entry.get("reason"),
                        "seconds": float(entry["ended"]) - float(entry["at"]) if entry.get("ended") else None,
                        "detail": entry.get("detail", ""),
                    }
                )
    return sorted(out, key=lambda r: r["at"])


def _silences(db: sqlite3.Connection, start: float, end: float) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT rule, match, starts, ends, reason, author, expired FROM silences"
        " WHERE starts < ? AND COALESCE(expired, ends) > ? ORDER BY starts",
        (end, start),
    )
    return [
        {
            "rule": r["rule"],
            "match": json.loads(r["match"]) if r["match"] else {},
            "starts": iso(r["starts"]),
            "ends": iso(r["expired"] if r["expired"] is not None else r["ends"]),
            "reason": r["reason"],
            "author": r["author"],
        }
        for r in rows
    ]
