"""Guards: the checks a planned run passes on its way from the dispatcher to its action. Each "no"
is recorded with its reason, on the run, and shown by ``specguard history``.

In order:

1. ``dry_run`` (the daemon's) and ``shadow`` (the rule's), when the event is recorded;
2. then in the transaction that writes the event, so that two rules firing at the same moment
   cannot both slip under a budget:

   - a firing:
     - silences (``specguard silence``): a silence that takes the rule and the series' labels;
     - dedup: a series whose last firing was acted on, and not yet its resolution, is not acted on
       again (a world-changing action's restore still waiting out its quiet period is called off
       first: the series is still held);
     - cooldown (the action's ``cooldown``): per rule, action and series;
     - budget (the action's ``budget``): at most ``runs`` runs of the action per ``per``, every
       rule together;
   - a resolution: a restore (world-changing actions) or a notice (the others) only where the
     firing was acted on: nothing else was engaged or told.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from actions import Action
from daemon.dispatch import silences
from daemon.engine import Event, State
from daemon.store import PlannedRun
from rules.durations import format_duration


class _Acted(NamedTuple):
    run: int
    kind: str  # the event's: firing | resolved


def _last_acted(db: sqlite3.Connection, event: Event, action: str) -> _Acted | None:
    """The newest run of ``action`` for the event's rule and series that was not held back."""
    row = db.execute(
        "SELECT r.id, e.kind FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        "AND e.rule = ? AND e.series = ? AND r.status != 'skipped' ORDER BY r.id DESC LIMIT 1",
        (action, event.rule, event.series),
    ).fetchone()
    return None if row is None else _Acted(row[0], row[1])


def _unresolved_firing(db: sqlite3.Connection, event: Event, action: str) -> int | None:
    """The newest run of ``action`` that acted on a firing of the event's series, if what it did
    still stands: the series has not resolved since (whether or not the resolution ran the action:
    one that restores nothing has no run for it), or its restore was called off."""
    row = db.execute(
        "SELECT r.id, e.id FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        "AND e.rule = ? AND e.series = ? AND e.kind = 'firing' AND r.status != 'skipped' "
        "ORDER BY r.id DESC LIMIT 1",
        (action, event.rule, event.series),
    ).fetchone()
    if row is None:
        return None
    resolved = db.execute(
        "SELECT id FROM events WHERE rule = ? AND series = ? AND kind = 'resolved' AND id > ? "
        "ORDER BY id DESC LIMIT 1",
        (event.rule, event.series, row[1]),
    ).fetchone()
    if resolved is None:
        return int(row[0])
    # Resolved, but its restore was called off (it fired again in the quiet period): what the
    # firing's run changed is still in place.
    called_off = db.execute(
        "SELECT 1 FROM action_runs WHERE event_id = ? AND action = ? AND mode = 'restore' "
        "AND status = 'skipped' LIMIT 1",
        (resolved[0], action),
    ).fetchone()
    return int(row[0]) if called_off else None


def _call_off_restores(db: sqlite3.Connection, event: Event, action: str) -> int:
    return db.execute(
        "UPDATE action_runs SET status = 'skipped', reason = ?, finished = ? WHERE status = 'pending' "
        "AND mode = 'restore' AND action = ? AND event_id IN (SELECT id FROM events WHERE rule = ? "
        "AND series = ?)",
        (
            "fired again during the quiet period: the series still holds it",
            event.at,
            action,
            event.rule,
            event.series,
        ),
    ).rowcount


def _last_firing_run(db: sqlite3.Connection, event: Event, action: str) -> float | None:
    row = db.execute(
        "SELECT max(r.created) FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        "AND e.rule = ? AND e.series = ? AND e.kind = 'firing' AND r.mode = 'run' AND r.status != 'skipped'",
        (action, event.rule, event.series),
    ).fetchone()
    return None if row[0] is None else float(row[0])


def _runs_since(db: sqlite3.Connection, action: str, since: float) -> int:
    row = db.execute(
        "SELECT count(*) FROM action_runs WHERE action = ? AND created > ? AND mode = 'run' "
        "AND status != 'skipped'",
        (action, since),
    ).fetchone()
    return int(row[0])


def check(
    db: sqlite3.Connection, event: Event, planned: PlannedRun, actions: Mapping[str, Action]
) -> PlannedRun:
    """``planned`` as it is to be written: pending, or skipped with the guard's reason."""
    action = actions.get(planned.action)
    if action is None:
        return planned  # the dispatcher fails it, saying the action is no longer configured

    def hold(reason: str) -> PlannedRun:
        return replace(planned, status="skipped", reason=reason)

    if event.kind is State.FIRING:
        silence = silences.silencing(db, event.rule, event.labels, event.at)
        if silence is not None:
            until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(silence.ends))
            return hold(
                f"silenced: by silence {silence.id} until {until} ({silence.author}: {silence.reason})"
            )
        if action.changes_world:
            _call_off_restores(db, event, planned.action)
        acted = _unresolved_firing(db, event, planned.action)
        if acted is not None:
            return hold(f"dedup: this series' firing was acted on already (run {acted}) and has not resolved")
        params = action.params
        if params.cooldown > 0:
            since = _last_firing_run(db, event, planned.action)
            if since is not None and event.at - since < params.cooldown:
                return hold(
                    f"cooldown: acted on this series' firing {format_duration(round(event.at - since))} "
                    f"ago; the cooldown is {format_duration(params.cooldown)}"
                )
        budget = params.budget
        if budget is not None:
            used = _runs_since(db, planned.action, event.at - budget.per)
            if used >= budget.runs:
                return hold(
                    f"budget: {planned.action} ran {used} times in the last {format_duration(budget.per)}; "
                    f"its budget is {budget.runs} per {format_duration(budget.per)}"
                )
        return planned
    last = _last_acted(db, event, planned.action)
    if last is None or last.kind != State.FIRING.value:
        what = "nothing to restore" if planned.mode == "restore" else "nothing to tell"
        return hold(f"the firing was not acted on: {what}")
    return planned
