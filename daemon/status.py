"""What the daemon says about itself: health (is every rule evaluated on schedule?) and status rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specguard import __version__
from specguard.config.loading import LoadedRule
from specguard.engine.detection import shown
from specguard.rules.durations import format_duration
from specguard.rules.schema import Detect
from specguard.store.records import SeriesState, State

# A round is late when it has not happened for this many of its intervals (at least MIN_STALL).
STALL_INTERVALS = 3
MIN_STALL = 10.0


def health(
    due: Mapping[float, float | None], started_at: float, now: float, rules: int
) -> tuple[bool, dict[str, Any]]:
    """Healthy while every evaluation interval ran within ``STALL_INTERVALS`` of its interval.

    ``due`` maps each interval in use to the time its last round finished (None: not yet).
    """
    late = []
    for interval, last in sorted(due.items()):
        allowed = max(STALL_INTERVALS * interval, MIN_STALL)
        since = now - (last if last is not None else started_at)
        if since > allowed:
            late.append(
                f"the {format_duration(interval)} rules last ran {since:.0f}s ago (allowed {allowed:.0f}s)"
            )
    finished = [t for t in due.values() if t is not None]
    body: dict[str, Any] = {
        "status": "stalled" if late else "ok",
        "version": __version__,
        "last_evaluation": max(finished) if finished else None,
        "rules": rules,
    }
    if late:
        body["reason"] = "; ".join(late)
    return not late, body


def rule_rows(
    rules: list[LoadedRule],
    states: Mapping[str, Mapping[str, SeriesState]],
    errors: Mapping[str, str | None],
    verdicts: Mapping[str, tuple[str, str | None]] | None = None,
    interval: float = 15.0,
) -> list[dict[str, Any]]:
    """One row per series of every enabled rule (one row for a rule without series, with the
    verdict of its last evaluation and why: an error, warming up, no data and the scrape errors).
    A detector's rows carry its statistic G, threshold h and dispersion φ (``interval``: the
    config's, for the rules without their own)."""
    rows: list[dict[str, Any]] = []
    for item in rules:
        rule = item.rule
        every = item.every(interval)
        common = {
            "rule": rule.name,
            "signal": rule.signal,
            "expr": rule.expr,
            "condition": str(rule.test),
            # what its value is over (an alert rule's is the alerts Alertmanager holds now)
            "window": None if rule.alert_only else every if rule.detect is not None else rule.window,
            "severity": rule.severity.value,
            "shadow": rule.shadow,
            "alert": [str(m) for m in rule.alert.matchers] if rule.alert is not None else None,
            "error": errors.get(rule.name),
        }
        series_of = states.get(rule.name, {})
        if not series_of:
            verdict, reason = (verdicts or {}).get(rule.name, (None, None))
            rows.append(
                {
                    **common,
                    "labels": {},
                    "state": State.INACTIVE.value,
                    "value": None,
                    "threshold": None,
                    "verdict": verdict,
                    "reason": reason,
                    "since": None,
                }
            )
        for series in series_of.values():
            rows.append(
                {
                    **common,
                    "labels": dict(series.labels),
                    "state": series.state.value,
                    "value": series.value,
                    "threshold": series.threshold,
                    "verdict": series.verdict.value if series.verdict else None,
                    "since": series.since,
                    "moved_by": series.moved_by,
                    "error": series.error or common["error"],
                    **detector_row(rule.detect, series, every),
                }
            )
    return rows


def status_line(rows: list[dict[str, Any]], targets: list[dict[str, object]], store_error: str | None) -> str:
    """One line for systemd's STATUS= (``systemctl status`` shows it): how many rules, which fire,
    what the targets and the store do. Only what changes with the daemon's state, so it is sent
    again only when something changed."""
    rules = sorted({row["rule"] for row in rows})
    firing = sorted({row["rule"] for row in rows if row["state"] == State.FIRING.value})
    pending = sorted({row["rule"] for row in rows if row["state"] == State.PENDING.value})
    parts = [f"{len(rules)} rule{'s' if len(rules) != 1 else ''}"]
    if firing:
        shown = ", ".join(firing[:3]) + (f" and {len(firing) - 3} more" if len(firing) > 3 else "")
        parts.append(f"firing: {shown}")
    else:
        parts.append("none firing")
    if pending:
        parts.append(f"{len(pending)} pending")
    if targets:
        up = sum(1 for t in targets if t.get("state") == "up")
        warming = sum(1 for t in targets if t.get("state") == "warming_up")
        parts.append(f"{up}/{len(targets)} targets up" + (f", {warming} warming up" if warming else ""))
    if store_error is not None:
        parts.append("STORE FAILING: " + " ".join(store_error.split())[:120])
    return "; ".join(parts)


def detector_row(detect: Detect | None, series: SeriesState, interval: float) -> dict[str, Any]:
    """``{"detector": {g, h, phi, ...}}`` for a detector's series, else nothing."""
    if detect is None:
        return {}
    return {"detector": shown(series, detect, interval)}
