"""Guards: the checks a planned run passes on its way from the dispatcher to its action. A guard
either lets the run go, holds it back for good (skipped, with the reason), or defers it (a
reason and the time it may go): a deferral is not a refusal. Every decision is recorded on the
run and shown by ``specguard history`` and ``/api/status``.

In order:

1. ``dry_run`` (the daemon's) and ``shadow`` (the rule's), when the event is recorded: skipped;
2. then in the transaction that writes the event, so that two rules firing at the same moment
   cannot both slip under a budget:

   - a firing:
     - actions that change the world: a restore of the series still waiting out its quiet period
       is called off (the series fires again: it still holds what the firing's run changed); then
       dedup: a series whose last firing was acted on, and not yet its resolution (or whose
       restore was just called off), still holds what that run changed: not acted on again
       (skipped), silenced or not. A notice answers every firing event: the engine moves a series
       to firing once per incident, and a series forgotten while it fired (no data, its rule
       removed and added back) that fires again is a new incident, paged as one;
     - silences (``specguard silence``): deferred until the silence ends;
     - cooldown (the action's ``cooldown``, per rule, action and series): deferred until it ends;
     - budget (the action's ``budget``, every rule together): deferred until the window has room;
   - a resolution: a restore (world-changing actions) or a notice (the others) only where the
     firing was acted on: nothing else was engaged or told. A firing run still deferred is
     skipped: what it answered is over.

3. A deferred run is looked at again on every tick (``recheck``): skipped once what it answered is
   over (the series resolved or was forgotten, its rule removed, disabled or no longer naming the
   action), else through the same guards again (a silence may have been expired early, or another
   added), and carried out as soon as none holds it back. A silenced page is sent once the
   silence ends if the incident still fires, as Alertmanager does.

The feature flag's runs are not planned here: its controller (``dispatch.fallback``)
derives them from the rules' states on every tick, and uses the same silence, cooldown and
budget checks.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from specguard.actions import Action
from specguard.actions.base import Budget
from specguard.config.loading import LoadedRule
from specguard.dispatch import silences
from specguard.rules.durations import format_duration
from specguard.store.records import Event, PlannedRun, RunMode, RunStatus, State

# When a run counts as acted on, for budgets and cooldowns: when its guards let it through, or,
# once it has ended, when it ended, whichever is later. A run that retried for a while (the flag
# API down) changed the world at its last try, not at its admission: counted from its admission,
# a budget of one per 5 minutes would let the next run change the world less than 5 minutes
# after it. Runs written before admission was recorded count from their creation unless they
# were held back.
_ADMITTED = (
    "coalesce(r.admitted, CASE WHEN r.status IN ('pending', 'running', 'ok', 'failed') THEN r.created END)"
)
ACTED_AT = f"max({_ADMITTED}, coalesce(r.finished, {_ADMITTED}))"
NOT_HELD = "r.status NOT IN ('skipped', 'deferred')"


@dataclass(frozen=True)
class Later:
    """A guard's "not now": why, and when it may go."""

    reason: str
    until: float


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


class _Acted(NamedTuple):
    run: int
    kind: str  # the event's: firing | resolved


def _last_acted(db: sqlite3.Connection, rule: str, series: str, action: str) -> _Acted | None:
    """The newest run of ``action`` for the rule's series that its guards let through."""
    row = db.execute(
        "SELECT r.id, e.kind FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        f"AND e.rule = ? AND e.series = ? AND {NOT_HELD} ORDER BY r.id DESC LIMIT 1",
        (action, rule, series),
    ).fetchone()
    return None if row is None else _Acted(row[0], row[1])


def _unresolved_firing(db: sqlite3.Connection, event: Event, action: str) -> int | None:
    """The newest run of ``action`` that acted on a firing of the event's series, if what it did
    still stands: the series has not resolved since (whether or not the resolution ran the action:
    one that restores nothing has no run for it), or its restore was called off."""
    row = db.execute(
        "SELECT r.id, e.id FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        f"AND e.rule = ? AND e.series = ? AND e.kind = 'firing' AND {NOT_HELD} "
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


def call_off_restores(db: sqlite3.Connection, rule: str, series: str, action: str, at: float) -> int:
    return db.execute(
        "UPDATE action_runs SET status = 'skipped', reason = ?, finished = ? WHERE status = 'pending' "
        "AND mode = 'restore' AND action = ? AND event_id IN (SELECT id FROM events WHERE rule = ? "
        "AND series = ?)",
        ("fired again during the quiet period: the series still holds it", at, action, rule, series),
    ).rowcount


def _close_deferred(db: sqlite3.Connection, event: Event, action: str) -> None:
    """The series resolved: its firing runs still deferred answer nothing any more."""
    rows = db.execute(
        "SELECT r.id, r.reason FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        "AND r.status = 'deferred' AND e.rule = ? AND e.series = ?",
        (action, event.rule, event.series),
    ).fetchall()
    for run_id, reason in rows:
        db.execute(
            "UPDATE action_runs SET status = 'skipped', reason = ?, finished = ? WHERE id = ?",
            (f"the series {event.kind.value} while held back ({reason}): nothing to do", event.at, run_id),
        )


def silenced(db: sqlite3.Connection, rule: str, labels: Mapping[str, str], at: float) -> Later | None:
    silence = silences.silencing(db, rule, labels, at)
    if silence is None:
        return None
    return Later(
        f"silenced: by silence {silence.id} until {when(silence.ends)} ({silence.author}: {silence.reason})",
        silence.ends,
    )


def cooling(
    db: sqlite3.Connection, rule: str, series: str, action: str, cooldown: float, at: float
) -> Later | None:
    """The action acted on a firing of this series less than ``cooldown`` ago."""
    if cooldown <= 0:
        return None
    row = db.execute(
        f"SELECT max({ACTED_AT}) FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        "AND e.rule = ? AND e.series = ? AND e.kind = 'firing' AND r.mode = 'run'",
        (action, rule, series),
    ).fetchone()
    if row[0] is None or at - float(row[0]) >= cooldown:
        return None
    since = float(row[0])
    return Later(
        f"cooldown: acted on this series' firing {format_duration(round(at - since))} ago; the cooldown is "
        f"{format_duration(cooldown)}",
        since + cooldown,
    )


def over_budget(db: sqlite3.Connection, action: str, budget: Budget | None, at: float) -> Later | None:
    """The action ran ``budget.runs`` times in the last ``budget.per``: deferred until the oldest of
    them leaves the window."""
    if budget is None:
        return None
    acted = [
        float(row[0])
        for row in db.execute(
            f"SELECT {ACTED_AT} AS acted FROM action_runs r WHERE r.action = ? AND r.mode = 'run' AND acted > ? "
            "ORDER BY acted",
            (action, at - budget.per),
        )
    ]
    if len(acted) < budget.runs:
        return None
    return Later(
        f"budget: {action} ran {len(acted)} times in the last {format_duration(budget.per)}; its budget is "
        f"{budget.runs} per {format_duration(budget.per)}",
        acted[len(acted) - budget.runs] + budget.per,
    )


def holding_back(
    db: sqlite3.Connection, rule: str, series: str, labels: Mapping[str, str], action: Action, at: float
) -> Later | None:
    """The first of silence, cooldown and budget that holds a firing's run back now."""
    return (
        silenced(db, rule, labels, at)
        or cooling(db, rule, series, action.name, action.params.cooldown, at)
        or over_budget(db, action.name, action.params.budget, at)
    )


def check(
    db: sqlite3.Connection, event: Event, planned: PlannedRun, actions: Mapping[str, Action]
) -> PlannedRun:
    """``planned`` as it is to be written: pending, deferred or skipped, with the guard's reason."""
    action = actions.get(planned.action)
    if action is None:
        return planned  # the dispatcher fails it, saying the action is no longer configured

    def hold(reason: str) -> PlannedRun:
        return replace(planned, status=RunStatus.SKIPPED, reason=reason)

    if event.kind is State.FIRING:
        if action.changes_world:  # before anything may hold this run back: the series still holds it
            call_off_restores(db, event.rule, event.series, planned.action, event.at)
            acted = _unresolved_firing(db, event, planned.action)
            if acted is not None:
                return hold(
                    f"dedup: this series' firing was acted on already (run {acted}) and has not resolved"
                )
        later = silenced(db, event.rule, event.labels, event.at)
        later = later or cooling(
            db, event.rule, event.series, planned.action, action.params.cooldown, event.at
        )
        later = later or over_budget(db, planned.action, action.params.budget, event.at)
        if later is not None:
            return replace(planned, status=RunStatus.DEFERRED, reason=later.reason, not_before=later.until)
        return planned
    _close_deferred(db, event, planned.action)
    last = _last_acted(db, event.rule, event.series, planned.action)
    if last is None or last.kind != State.FIRING.value:
        what = "nothing to restore" if planned.mode == RunMode.RESTORE else "nothing to tell"
        return hold(f"the firing was not acted on: {what}")
    return planned


@dataclass(frozen=True)
class Rechecked:
    run: int
    action: str
    rule: str
    status: RunStatus  # pending (admitted now), deferred (still), skipped (over)
    reason: str
    until: float | None = None


def recheck(
    db: sqlite3.Connection,
    actions: Mapping[str, Action],
    rules: Mapping[str, LoadedRule],
    dry_run: bool,
    now: float,
) -> list[Rechecked]:
    """Every deferred run of the actions the dispatcher carries out, looked at again in one
    transaction: skipped when what it answered is over, admitted when no guard holds it back
    any more, else deferred with the reason that holds now. Returns what changed."""
    changed: list[Rechecked] = []
    rows = db.execute(
        "SELECT r.id, r.action, r.reason, r.not_before, e.id AS event, e.rule, e.series, e.labels, e.kind "
        "FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.status = 'deferred' ORDER BY r.id"
    ).fetchall()
    for row in rows:
        action = actions.get(row["action"])
        if action is not None and action.reconciled:
            continue  # the fallback controller's
        over = _over(db, row, action, rules, dry_run)
        if over is not None:
            reason = f"{over} while held back ({row['reason']}): nothing to do"
            db.execute(
                "UPDATE action_runs SET status = 'skipped', reason = ?, finished = ?, not_before = NULL "
                "WHERE id = ?",
                (reason, now, row["id"]),
            )
            changed.append(Rechecked(row["id"], row["action"], row["rule"], RunStatus.SKIPPED, reason))
            continue
        assert action is not None
        labels = _labels(row["labels"])
        later = holding_back(db, row["rule"], row["series"], labels, action, now)
        if later is None:
            db.execute(
                "UPDATE action_runs SET status = 'pending', not_before = NULL, admitted = ? WHERE id = ?",
                (now, row["id"]),
            )
            changed.append(Rechecked(row["id"], row["action"], row["rule"], RunStatus.PENDING, row["reason"]))
        elif (later.reason, later.until) != (row["reason"], row["not_before"]):
            db.execute(
                "UPDATE action_runs SET reason = ?, not_before = ? WHERE id = ?",
                (later.reason, later.until, row["id"]),
            )
            changed.append(
                Rechecked(
                    row["id"], row["action"], row["rule"], RunStatus.DEFERRED, later.reason, later.until
                )
            )
    return changed


def _over(
    db: sqlite3.Connection,
    row: sqlite3.Row,
    action: Action | None,
    rules: Mapping[str, LoadedRule],
    dry_run: bool,
) -> str | None:
    """Why the deferred run's firing no longer wants an answer, or None while it does."""
    if action is None:
        return f"the action {row['action']} was removed from the config"
    if dry_run:
        return "the daemon runs dry"
    item = rules.get(row["rule"])
    if item is None:
        return f"the rule {row['rule']} was removed from the config"
    if not item.rule.enabled:
        return f"the rule {row['rule']} was disabled"
    if item.rule.shadow:
        return f"the rule {row['rule']} is a shadow rule"
    if row["action"] not in item.rule.actions:
        return f"the rule {row['rule']} no longer names {row['action']}"
    newer = db.execute(
        "SELECT kind FROM events WHERE rule = ? AND series = ? AND id > ? ORDER BY id DESC LIMIT 1",
        (row["rule"], row["series"], row["event"]),
    ).fetchone()
    if newer is not None:
        return f"the series went {newer[0]}"
    state = db.execute(
        "SELECT state FROM series_state WHERE rule = ? AND series = ?", (row["rule"], row["series"])
    ).fetchone()
    if state is None:
        return "the series was forgotten (no data)"
    if state[0] != State.FIRING.value:
        return f"the series is {state[0]}"
    return None


def _labels(text: str) -> dict[str, str]:
    value = json.loads(text)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
