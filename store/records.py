"""What the store keeps of the rules' states and the actions' runs: small records, below the engine
and the dispatcher that make them and the store that saves them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# What evaluated a rule: its schedule, unless an Alertmanager delivery did (see daemon.alertmanager).
SCHEDULE = "schedule"


class State(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class Verdict(StrEnum):
    BREACH = "breach"
    OK = "ok"
    NO_DATA = "no_data"
    ERROR = "error"
    WARMING_UP = "warming_up"


@dataclass(frozen=True)
class SeriesState:
    labels: Mapping[str, str]
    state: State = State.INACTIVE
    since: float | None = None  # when the current state began
    breach_since: float | None = None  # start of the current run of breaches
    last_breach: float | None = None
    consecutive: int = 0  # breaching evaluations in a row
    verdict: Verdict | None = None
    value: float | None = None
    threshold: float | None = None
    error: str | None = None
    last_eval: float | None = None
    ok_since: float | None = None  # first ok evaluation of a firing series (keep_firing_for)
    last_data: float | None = None  # last evaluation that had a value for the series
    last_seen: float | None = None  # last evaluation whose source knew the series
    moved_by: str | None = None  # the trigger of the evaluation that last changed the state
    # A sequential detector's own state (its statistic, warm-up and calibration; JSON values),
    # kept with the series so that it survives restarts; None for threshold rules.
    detector: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Event:
    """A state transition of one series."""

    rule: str
    series: str
    labels: Mapping[str, str]
    kind: State  # the state entered
    previous: State
    at: float
    value: float | None
    threshold: float | None
    trigger: str = SCHEDULE
    since: float | None = None  # a firing's: when the run of breaches that fired it began


@dataclass(frozen=True)
class RunOutcome:
    """How one action run ended: what a notifying action tells about the others."""

    rule: str
    series: str
    event: str  # firing | resolved
    action: str
    mode: str  # run | restore
    status: str  # ok | failed | deferred (told only when ``page``)
    detail: str
    at: float  # when it ended
    page: bool = False  # on-call must hear of it now (see actions.base.Outcome.page)


class RunStatus(StrEnum):
    """Where an action run stands. ``deferred``: a guard said "not now" (a silence, a cooldown, the
    budget), with the reason and the time it may go (``not_before``); it is looked at again on
    every tick and runs once the reason is gone, unless what it answered is over by then."""

    PENDING = "pending"  # admitted by the guards; carried out once due (``not_before``)
    RUNNING = "running"  # under way (a run found so at start was cut short: carried out again)
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # never to run, with the reason
    DEFERRED = "deferred"


class RunMode(StrEnum):
    RUN = "run"  # do what the action does (engage a flag, step k down, tell on-call)
    RESTORE = "restore"  # undo what a world-changing action did
    HOLD = "hold"  # a firing met the fallback already engaged: held, nothing written


OPEN = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.DEFERRED)


@dataclass(frozen=True)
class PlannedRun:
    """What the dispatcher decided for one action of an event."""

    action: str
    status: str  # RunStatus: pending | skipped | deferred
    reason: str = ""
    mode: str = "run"  # RunMode: run | restore (undo what a world-changing action did)
    # Not carried out before this time: a restore's quiet period, or when a deferral may end.
    not_before: float | None = None


@dataclass(frozen=True)
class EventRecord:
    """An event with what the dispatcher decided for it."""

    event: Event
    severity: str
    summary: str
    annotations: Mapping[str, str]
    shadow: bool
    dry_run: bool
    runs: Sequence[PlannedRun]
    trigger: str = "schedule"  # what evaluated the rule: the schedule, or an Alertmanager delivery


@dataclass(frozen=True)
class ActionRun:
    id: int
    event_id: int
    action: str
    status: str
    attempts: int
    mode: str
    at: float
    series: str
    rule: str
    kind: str
    labels: dict[str, str]
    value: float | None
    threshold: float | None
    severity: str
    summary: str
    annotations: dict[str, str]
    since: float | None = None  # a firing's: when its breach began
