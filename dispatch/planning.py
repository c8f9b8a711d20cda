"""What an event asks of a rule's actions: the runs to record with it (nothing runs yet; the guards
have the last word when it is stored); and the deferred runs looked at again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from specguard.actions import Action
from specguard.config.loading import LoadedRule
from specguard.dispatch import guards
from specguard.metrics.registry import DaemonMetrics
from specguard.store.connection import transaction
from specguard.store.database import Store
from specguard.store.records import Event, PlannedRun, RunStatus, State

log = logging.getLogger("specguard.dispatcher")

ACTIONABLE = (State.FIRING, State.RESOLVED)


def planned_runs(
    item: LoadedRule, event: Event, actions: Mapping[str, Action], dry_run: bool
) -> list[PlannedRun]:
    """A firing runs each of the rule's actions (a feature flag's controller answers it instead,
    unless the rule is a shadow or the daemon runs dry); a resolution runs the actions that only
    tell and restores the ones that undo on their own, after their delay."""
    runs: list[PlannedRun] = []
    if event.kind not in ACTIONABLE:
        return runs
    for name in item.rule.actions:
        action = actions.get(name)
        if action is not None and action.reconciled and not (item.rule.shadow or dry_run):
            continue  # its controller answers every firing from the rules' states
        if (
            event.kind is State.RESOLVED
            and action is not None
            and action.changes_world
            and not action.restores
        ):
            continue  # it undoes nothing when the rule resolves (a ladder steps up by hand)
        restore = event.kind is State.RESOLVED and action is not None and action.restores
        mode = "restore" if restore else "run"
        not_before = event.at + action.restore_delay if restore and action is not None else None
        if item.rule.shadow:
            runs.append(PlannedRun(name, "skipped", "shadow rule: evaluated and recorded, never acts", mode))
        elif dry_run:
            runs.append(PlannedRun(name, "skipped", "dry run", mode))
        else:
            runs.append(PlannedRun(name, "pending", "", mode, not_before))
    return runs


async def recheck(
    store: Store,
    actions: Mapping[str, Action],
    rules: Mapping[str, LoadedRule],
    dry_run: bool,
    now: float,
    metrics: DaemonMetrics,
) -> None:
    """Deferred runs looked at again: admitted (then carried out), deferred on, or skipped."""

    def look(db: Any) -> list[guards.Rechecked]:
        with transaction(db):
            return guards.recheck(db, actions, rules, dry_run, now)

    for changed in await store.call(look):
        if changed.status == RunStatus.PENDING:
            log.info("%s: %s may run now (was: %s)", changed.rule, changed.action, changed.reason)
        elif changed.status == RunStatus.SKIPPED:
            log.info("%s: not running %s (%s)", changed.rule, changed.action, changed.reason)
            metrics.action_runs.labels(changed.action, "skipped").inc()
