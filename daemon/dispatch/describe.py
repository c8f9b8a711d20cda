"""What the dispatcher says of events and runs: an event's summary and annotations, rendered from
the rule's templates, and the runs that wait, as ``/api/status`` shows them."""

from __future__ import annotations

import json
import logging
from typing import Any

from daemon.engine import Event
from daemon.loading import LoadedRule
from rules.templates import render

log = logging.getLogger("specguard.dispatcher")


def describe(item: LoadedRule, event: Event) -> tuple[str, dict[str, str]]:
    """The event's summary and rendered annotations."""
    rule = item.rule
    fields = {
        "threshold": event.threshold,
        "rule": rule.name,
        "signal": rule.signal or ("alerts" if rule.alert_only else "expr"),
        "severity": rule.severity.value,
        "state": event.kind.value,
    }
    annotations = {}
    for key, template in rule.annotations.items():
        try:
            annotations[key] = render(template, labels=event.labels, value=event.value, **fields)
        except ValueError as exc:
            annotations[key] = template
            log.warning("rule %s: annotation %s: %s", rule.name, key, exc)
    summary = annotations.get("summary")
    if summary is None:
        where = ", ".join(f"{k}={v}" for k, v in sorted(event.labels.items())) or "all series"
        value = "no data" if event.value is None else f"{event.value:.4g}"
        if rule.alert is not None and rule.alert_only:
            matchers = ", ".join(str(m) for m in rule.alert.matchers)
            summary = f"{value} Alertmanager alert(s) {{{matchers}}} firing on {where}"
        elif rule.detect is not None:
            h = "?" if event.threshold is None else f"{event.threshold:.4g}"
            summary = f"{rule.detect.describe()}: G = {value} of h = {h} on {where}"
        else:
            summary = f"{rule.signal or 'expr'} = {value} ({rule.test}) on {where}"
    return summary, annotations


def waiting(db: Any) -> list[dict[str, Any]]:
    """The runs that wait, oldest first: what holds each back and until when."""
    rows = db.execute(
        "SELECT r.id, r.action, r.mode, r.status, r.reason, r.detail, r.not_before, r.attempts, e.rule, "
        "e.labels, e.kind FROM action_runs r JOIN events e ON e.id = r.event_id "
        "WHERE r.status IN ('deferred', 'pending', 'running') ORDER BY r.id LIMIT 200"
    ).fetchall()
    return [
        {
            "run": row["id"],
            "action": row["action"],
            "mode": row["mode"],
            "status": row["status"],
            "rule": row["rule"],
            "labels": json.loads(row["labels"]),
            "event": row["kind"],
            "why": row["reason"] if row["status"] == "deferred" else row["detail"],
            "until": row["not_before"],
            "attempts": row["attempts"],
        }
        for row in rows
    ]
