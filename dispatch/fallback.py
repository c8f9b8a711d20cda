"""The fallback controller: what a feature flag should be, derived from the rules' states on every
tick, compared with what was last confirmed, and made true (level-triggered, as a Kubernetes
controller reconciles), so that a missed event, a failed write or a crash costs a delay and never
a wrong end state.

What should be true (``decide``, pure):

- **engaged** while an *eligible* series fires unsilenced (its rule configured, enabled, not a
  shadow, naming the flag in its actions), or a ladder holds it for its change (a drain);
- **kept engaged** while the flag is (or may be) engaged by specguard and an eligible series fires,
  silenced or not (a silence holds back what specguard would start; it never makes it undo);
- **restored** once none fires and none holds it, after ``quiet_period`` counted from the moment
  the last one stopped, and after the canary (when configured and a rule held it) sees
  acceptance back; a canary that does not keeps the fallback, and is tried again;
- left alone when specguard did not engage it (a flag engaged by hand, with nothing firing).

What was last confirmed is the action's record (``actions.feature_flag``), read back from the
world where it can be (the flag file on every tick, a GET on the flag API when ``read_url`` is
configured). When the two differ the controller writes, through the guards: an engage is
deferred (never dropped) while a cooldown or the budget holds it back; a silenced series defers
its own answer until the silence ends. A write that fails is tried again with backoff.

Every decision is a run of the flag on an event, shown by ``specguard history``: on each firing of
an eligible series, what the fallback did for it (``run``: it engaged the flag; ``hold``: it met
the flag engaged; ``deferred``: silenced, cooldown or budget, until when; ``skipped``: over before
it could act); and the restore, on the event of the last series to stop (its resolution).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specguard.actions.feature_flag import (
    ENGAGED,
    RESTORED,
    UNKNOWN,
    FeatureFlagAction,
    confirmed,
    holder_name,
    record_of,
)
from specguard.config.loading import LoadedRule
from specguard.dispatch import guards
from specguard.store.connection import transaction
from specguard.store.records import RunMode, RunStatus

log = logging.getLogger("specguard.fallback")

STATE_KEY = "flag"


@dataclass(frozen=True)
class Firing:
    """An eligible series that fires, with its current firing event."""

    rule: str
    series: str
    labels: Mapping[str, str]
    event: int
    silence: guards.Later | None = None

    @property
    def holder(self) -> str:
        return holder_name(self.rule, self.labels)


@dataclass(frozen=True)
class Desire:
    """What the flag should be now, and why."""

    want: str  # engaged | restored | alone (not specguard's to change)
    why: str
    holders: tuple[str, ...] = ()
    hold_end: float | None = None  # when the last holder stopped (the quiet period's start)
    rule_held: bool = False  # a rule's series held it during this engagement: a restore needs the canary
    restore_at: float | None = None


def decide(
    firing: Sequence[Firing], drains: Sequence[str], record: Mapping[str, Any], quiet: float, now: float
) -> Desire:
    """The flag's desired state from the eligible firing series, the drains that hold it, and
    what was last confirmed (``record``). Pure: the clock is passed in."""
    state = record["state"]
    ours = state in (ENGAGED, UNKNOWN)
    acting = [f for f in firing if f.silence is None]
    holders = tuple(sorted({f.holder for f in firing} | set(drains)))
    rule_held = bool(record.get("rule_held")) or bool(acting) or (ours and bool(firing))
    if acting or drains:
        who = ", ".join(holders[:3]) + (f" and {len(holders) - 3} more" if len(holders) > 3 else "")
        return Desire(ENGAGED, f"held by {who}", holders, None, rule_held)
    if not ours:
        return Desire("alone", "nothing fires", holders, None, False)
    if firing:
        return Desire(
            ENGAGED, f"kept: {', '.join(holders[:3])} fire(s) under a silence", holders, None, rule_held
        )
    hold_end = record.get("hold_end")
    hold_end = float(hold_end) if hold_end is not None else now
    restore_at = hold_end + quiet if rule_held else now
    return Desire(RESTORED, "nothing holds it", (), hold_end, rule_held, restore_at)


@dataclass
class Run:
    """One of the flag's runs that is still open (pending, running or deferred)."""

    id: int
    event: int
    mode: str
    status: str
    not_before: float | None
    reason: str
    attempts: int
    rule: str
    series: str
    kind: str


@dataclass
class Plan:
    """What one reconcile decided: the run to carry out now, if any, and when to look again."""

    desire: Desire
    carry_out: Run | None = None
    next_look: float | None = None
    changed: list[str] = field(default_factory=list)  # lines for the log


def eligible_rules(rules: Mapping[str, LoadedRule], action: str) -> list[str]:
    return sorted(
        name
        for name, item in rules.items()
        if item.rule.enabled and not item.rule.shadow and action in item.rule.actions
    )


def read_firing(db: sqlite3.Connection, rules: Sequence[str], now: float) -> list[Firing]:
    if not rules:
        return []
    marks = ",".join("?" * len(rules))
    out = []
    for row in db.execute(
        f"SELECT rule, series, labels FROM series_state WHERE state = 'firing' AND rule IN ({marks}) "
        "ORDER BY rule, series",
        tuple(rules),
    ).fetchall():
        event = db.execute(
            "SELECT max(id) FROM events WHERE rule = ? AND series = ? AND kind = 'firing'",
            (row["rule"], row["series"]),
        ).fetchone()[0]
        if event is None:  # a state without its event (written by hand): nothing to answer on
            continue
        labels = json.loads(row["labels"])
        silence = guards.silenced(db, row["rule"], labels, now)
        out.append(Firing(row["rule"], row["series"], labels, int(event), silence))
    return out


def _open_runs(db: sqlite3.Connection, action: str) -> list[Run]:
    rows = db.execute(
        "SELECT r.id, r.event_id, r.mode, r.status, r.not_before, r.reason, r.attempts, e.rule, e.series, "
        "e.kind FROM action_runs r JOIN events e ON e.id = r.event_id WHERE r.action = ? "
        "AND r.status IN ('pending', 'running', 'deferred') ORDER BY r.id",
        (action,),
    ).fetchall()
    return [Run(*tuple(row)) for row in rows]


def _row_for(db: sqlite3.Connection, action: str, event: int) -> tuple[int, str, str] | None:
    row = db.execute(
        "SELECT id, status, mode FROM action_runs WHERE action = ? AND event_id = ? AND mode IN ('run', 'hold') "
        "ORDER BY id DESC LIMIT 1",
        (action, event),
    ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))


def _set(db: sqlite3.Connection, run: int, **fields: Any) -> None:
    names = ", ".join(f"{name} = ?" for name in fields)
    db.execute(f"UPDATE action_runs SET {names} WHERE id = ?", (*fields.values(), run))


def _insert(db: sqlite3.Connection, action: str, event: int, now: float, **fields: Any) -> int:
    fields = {"event_id": event, "action": action, "created": now, **fields}
    names = ", ".join(fields)
    cursor = db.execute(
        f"INSERT INTO action_runs ({names}) VALUES ({','.join('?' * len(fields))})", tuple(fields.values())
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _read_record(db: sqlite3.Connection, action: str) -> dict[str, Any]:
    row = db.execute(
        "SELECT value FROM action_memory WHERE action = ? AND key = ?", (action, STATE_KEY)
    ).fetchone()
    return record_of(json.loads(row[0]) if row is not None else None)


def _write_record(db: sqlite3.Connection, action: str, record: Mapping[str, Any], now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO action_memory (action, key, value, updated) VALUES (?,?,?,?)",
        (action, STATE_KEY, json.dumps(dict(record)), now),
    )


def plan(
    db: sqlite3.Connection,
    flag: FeatureFlagAction,
    rules: Mapping[str, LoadedRule],
    drains: Sequence[str],
    world: str | None,
    now: float,
) -> Plan:
    """One reconcile's bookkeeping, in one transaction: read what fires, derive the desire, bring
    the flag's runs in line with it (open, defer, admit, call off), and say which change to carry
    out now. Writes nothing to the world."""
    name = flag.name
    with transaction(db):
        record = _read_record(db, name)
        result = Plan(Desire("alone", ""))
        if world is not None and world != record["state"]:
            seen = _seen(record, world, now, flag.backend.confirms)
            if seen is not None:
                result.changed.append(seen)
        firing = read_firing(db, eligible_rules(rules, name), now)
        desire = result.desire = decide(firing, drains, record, flag.flag.quiet_period, now)
        current = {f.event: f for f in firing}

        def close(run: Run, reason: str) -> None:
            _set(db, run.id, status=RunStatus.SKIPPED, reason=reason, finished=now, not_before=None)

        engage: Run | None = None
        restore: Run | None = None
        for run in _open_runs(db, name):
            if run.mode == RunMode.RESTORE:
                if desire.want == RESTORED and restore is None:
                    restore = run
                else:
                    close(run, f"called off: {desire.why}")
                    result.changed.append(f"restore called off: {desire.why}")
                continue
            f = current.get(run.event)
            under_way = run.status in (RunStatus.PENDING, RunStatus.RUNNING)
            if under_way and desire.want == ENGAGED and record["state"] != ENGAGED and engage is None:
                engage = run  # the change under way goes on, whichever series it was made for
            elif under_way and record["state"] == ENGAGED and desire.want == ENGAGED:
                _set(db, run.id, status=RunStatus.OK, finished=now, not_before=None,
                     detail="fallback engaged (confirmed when specguard looked again)")  # fmt: skip
            elif f is None:
                close(run, f"the series no longer fires ({desire.why}) " + (
                    f"while held back ({run.reason})" if run.status == RunStatus.DEFERRED else "before it was engaged"))  # fmt: skip
            elif f.silence is not None:
                _set(
                    db, run.id, status=RunStatus.DEFERRED, reason=f.silence.reason, not_before=f.silence.until
                )
            elif under_way and desire.want != ENGAGED:
                close(run, f"no longer wanted: {desire.why}")
        for f in firing:  # each firing's answer: deferred while silenced, held when engaged
            row = _row_for(db, name, f.event)
            if f.silence is not None:
                _defer(db, name, f, row, f.silence, now)
            elif (
                record["state"] == ENGAGED
                and desire.want == ENGAGED
                and (row is None or row[1] == RunStatus.DEFERRED)
            ):
                _hold(db, name, f, row, record, now)
        if desire.want == ENGAGED and record["state"] != ENGAGED:
            result.carry_out = (
                engage if engage is not None else _admit(db, flag, firing, record, bool(drains), now, result)
            )
            if result.carry_out is not None and not _due(result.carry_out, now):
                result.carry_out = None
        elif desire.want == RESTORED:
            result.carry_out = _restore(db, flag, record, desire, restore, now, result)
        held_by = [[f.rule, f.series] for f in firing]
        if desire.want == RESTORED:  # the last ones to hold it: the restore is recorded on their event
            held_by = record.get("held_by") or []
        record.update(
            holders={h: (record.get("holders") or {}).get(h, now) for h in desire.holders},
            held_by=held_by,
            hold_end=desire.hold_end,
            rule_held=desire.rule_held,
        )
        _write_record(db, name, record, now)
        waits = [r.not_before for r in _open_runs(db, name) if r.not_before is not None]
        if (
            result.carry_out is None
            and desire.want == RESTORED
            and not any(r.mode == RunMode.RESTORE for r in _open_runs(db, name))
        ):  # a restore recorded on no event (a drain's), waiting for its time
            waits.append(max(desire.restore_at or now, float(record.get("next_try") or now)))
        if result.carry_out is None and desire.want == ENGAGED and record.get("next_try") is not None:
            waits.append(float(record["next_try"]))
        result.next_look = min((t for t in waits if t > now), default=None)
    return result


def _due(run: Run, now: float) -> bool:
    return run.status == RunStatus.RUNNING or run.not_before is None or run.not_before <= now


def _seen(record: dict[str, Any], world: str, now: float, confirms: bool) -> str | None:
    """The record once the flag was read back from the world as ``world`` (which differs from what
    was confirmed); what to say of it, once. ``confirms``: a value read back is what the router
    follows (not so for a file whose reload command may not have run)."""
    was, last = record["state"], record.get("seen")
    record["seen"] = world
    if world == UNKNOWN:  # read, and neither throughout (the nginx router and its flag file disagree)
        if was == UNKNOWN:
            return None  # the change under way writes both
        if was == RESTORED:  # engaged in part, and not by specguard (by hand through one of them)
            return None if last == world else "the router and its flag file disagree: left as they are"
        confirmed(record, UNKNOWN, now)
        return "the router and its flag file disagree (changed by hand?): both written again"
    if was == UNKNOWN:
        if not confirms:
            return None  # written again, its reload command with it
        confirmed(record, world, now)
        return f"the flag reads {world}: confirmed"
    if was == RESTORED:  # engaged, and not by specguard: not ours to undo
        return (
            None
            if last == world
            else "the flag reads engaged, but specguard did not engage it: left as it is"
        )
    confirmed(record, world, now)
    return f"the flag reads {world}, not {was} as specguard left it (changed by hand?): put right if it should not be"


def _hold(
    db: sqlite3.Connection,
    action: str,
    f: Firing,
    row: tuple[int, str, str] | None,
    record: Mapping[str, Any],
    now: float,
) -> None:
    since = record.get("since")
    detail = "the fallback is engaged already" + (f" (since {guards.when(since)})" if since else "")
    others = sorted(set(record.get("holders") or {}) - {f.holder})
    if others:
        detail += f"; held by {', '.join(others[:3])}" + (
            f" and {len(others) - 3} more" if len(others) > 3 else ""
        )
    if row is None:
        _insert(db, action, f.event, now, status=RunStatus.OK, mode=RunMode.HOLD, detail=detail, started=now,
                finished=now)  # fmt: skip
    else:
        _set(db, row[0], status=RunStatus.OK, mode=RunMode.HOLD, detail=detail, started=now, finished=now,
             not_before=None, reason="")  # fmt: skip


def _admit(
    db: sqlite3.Connection,
    flag: FeatureFlagAction,
    firing: Sequence[Firing],
    record: Mapping[str, Any],
    drained: bool,
    now: float,
    result: Plan,
) -> Run | None:
    """No engage under way: the first series that fires unsilenced and that no guard holds back
    gets one (the others' answers are deferred with their reason). For a drain alone (a ladder's
    change under way, after a restart), a change recorded on no event."""
    name = flag.name
    acting = [f for f in firing if f.silence is None]
    for f in acting:
        row = _row_for(db, name, f.event)
        later = guards.cooling(db, f.rule, f.series, name, flag.params.cooldown, now) or guards.over_budget(
            db, name, flag.params.budget, now
        )
        if later is not None:
            _defer(db, name, f, row, later, now, renew=True)
            continue
        if row is not None and row[1] == RunStatus.DEFERRED:
            run_id = row[0]
            _set(db, run_id, status=RunStatus.PENDING, mode=RunMode.RUN, not_before=None, admitted=now)
        else:
            run_id = _insert(db, name, f.event, now, status=RunStatus.PENDING, mode=RunMode.RUN, admitted=now)
        result.changed.append(f"engage for {f.holder}")
        return Run(run_id, f.event, RunMode.RUN, RunStatus.PENDING, None, "", 0, f.rule, f.series, "firing")
    if acting or not drained:
        # every acting series held back (deferred, recorded on each); or only silenced series keep
        # a flag whose last write is not known: nothing is written for them (a silence starts
        # nothing), and the change under way, if any, goes on
        return None
    return Run(0, 0, RunMode.RUN, RunStatus.PENDING, record.get("next_try"), "", 0, "", "", "")


def _defer(
    db: sqlite3.Connection,
    action: str,
    f: Firing,
    row: tuple[int, str, str] | None,
    later: guards.Later,
    now: float,
    renew: bool = False,
) -> None:
    """The firing's answer deferred: recorded on its row, or a new one (``renew``: an engage is
    wanted again for a firing whose earlier answer is over, the flag restored since)."""
    if row is None or (renew and row[1] not in (RunStatus.DEFERRED, RunStatus.PENDING, RunStatus.RUNNING)):
        _insert(db, action, f.event, now, status=RunStatus.DEFERRED, mode=RunMode.RUN, reason=later.reason,
                not_before=later.until)  # fmt: skip
    elif row[1] == RunStatus.DEFERRED:
        _set(db, row[0], reason=later.reason, not_before=later.until)


def _restore(
    db: sqlite3.Connection,
    flag: FeatureFlagAction,
    record: Mapping[str, Any],
    desire: Desire,
    restore: Run | None,
    now: float,
    result: Plan,
) -> Run | None:
    """Bring the flag's rows in line with "restored"; the restore to carry out, if one is due."""
    at = desire.restore_at if desire.restore_at is not None else now
    if restore is None:
        event = _last_holders_event(db, record)
        if event is None:  # held by a ladder's change alone: nothing fired to record it on
            at = max(at, record.get("next_try") or at)
            return Run(0, 0, RunMode.RESTORE, RunStatus.PENDING, at, "", 0, "", "", "") if at <= now else None
        run_id = _insert(db, flag.name, event, now, status=RunStatus.PENDING, mode=RunMode.RESTORE, not_before=at,
                         admitted=now)  # fmt: skip
        result.changed.append(f"restore planned for {guards.when(at)}")
        restore = Run(run_id, event, RunMode.RESTORE, RunStatus.PENDING, at, "", 0, "", "", "")
    return restore if _due(restore, now) else None


def _last_holders_event(db: sqlite3.Connection, record: Mapping[str, Any]) -> int | None:
    """The newest event of the series that held the flag last (their resolution, usually), to
    record the restore on; None when only a drain held it."""
    best: int | None = None
    for rule, series in record.get("held_by") or []:
        row = db.execute(
            "SELECT max(id) FROM events WHERE rule = ? AND series = ?", (rule, series)
        ).fetchone()
        if row[0] is not None and (best is None or row[0] > best):
            best = int(row[0])
    return best
