"""What the dispatcher says of events and runs: an event's summary and annotations, rendered from
the rule's templates, and the runs that wait, as ``/api/status`` shows them."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from specguard.actions.base import ActionContext, ActionMemory
from specguard.config.loading import LoadedRule
from specguard.rules.messages import fields, message
from specguard.rules.templates import render
from specguard.store.records import ActionRun, Event, RunOutcome

log = logging.getLogger("specguard.dispatcher")


def describe(item: LoadedRule, event: Event) -> tuple[str, dict[str, str]]:
    """The event's summary, worded for its transition and value (``rules.messages``), and its
    rendered annotations (a rule's old ``summary`` annotation holds the same summary)."""
    rule = item.rule
    said = message(
        rule,
        kind=event.kind.value,
        previous=event.previous.value,
        value=event.value,
        threshold=event.threshold,
        labels=event.labels,
    )
    if said.problem is not None:
        log.warning(
            "rule %s: messages.%s: %s (said the default)", rule.name, said.wording.value, said.problem
        )
    known = fields(rule, event.kind.value, event.previous.value, event.value, event.labels)
    annotations = {}
    for key, template in rule.annotations.items():
        if key == "summary":
            annotations[key] = said.text  # worded for a firing: each transition says its own
            continue
        try:
            annotations[key] = render(
                template, labels=event.labels, value=event.value, threshold=event.threshold, **known
            )
        except ValueError as exc:
            annotations[key] = template
            log.warning("rule %s: annotation %s: %s", rule.name, key, exc)
    return said.text, annotations


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


def context_of(run: ActionRun, memory: ActionMemory, outcomes: Sequence[RunOutcome]) -> ActionContext:
    """What an action is told of the run it carries out: the event, its rule's words, its memory,
    and (for an action that observes them) how the event's other runs ended."""
    return ActionContext(
        rule=run.rule,
        event=run.kind,
        severity=run.severity,
        labels=run.labels,
        value=run.value,
        threshold=run.threshold,
        summary=run.summary,
        annotations=run.annotations,
        event_id=run.event_id,
        series=run.series,
        at=run.at,
        since=run.since,
        memory=memory,
        outcomes=tuple(outcomes),
    )
