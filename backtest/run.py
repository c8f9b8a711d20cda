"""A backtest from start to end: the plans, the source, both phases, and what they found."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.backtest import act, judge, plan, workers
from specguard.backtest.incidents import Incident, Recorded, recorded, score
from specguard.backtest.result import RuleResult, episodes_of, reproduce
from specguard.config.loading import Loaded
from specguard.sources.base import Source
from specguard.sources.history import HistorySource, Wanted, components_of
from specguard.store.connection import read_only


class BacktestError(Exception):
    """Input the backtest cannot use (an unreadable store, an empty period): said in one line."""


@dataclass
class Backtest:
    start: float
    end: float
    source: str  # history | prometheus
    rules: list[RuleResult] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    silences: int = 0
    flags: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    # The source the rules were judged on and how its clock is set: a calibration replays through it
    # (rules judged by workers: none, until ``replay_source()`` loads the history in this process).
    source_of: tuple[Source, Callable[[float], None]] | None = None
    history: tuple[Path, float, float, Wanted, Now] | None = None

    def replay_source(self) -> tuple[Source, Callable[[float], None]]:
        if self.source_of is None:
            assert self.history is not None
            store, first, end, wanted, now = self.history
            self.source_of = (history_source(store, first, end, wanted, now), now.set)
        return self.source_of


class Now:
    """The simulated clock the source reads."""

    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at

    def set(self, at: float) -> None:
        self.at = at


async def backtest(
    loaded: Loaded,
    start: float,
    end: float,
    names: Sequence[str] = (),
    prometheus: Any = None,
    incidents: Sequence[Incident] = (),
    live_store: Path | None = None,
    jobs: int | None = None,
) -> Backtest:
    """Replay ``loaded``'s rules (or ``names``) over [start, end). ``prometheus``: a source whose
    clock is the replay's (``prometheus_range.RangeSource``), else the store's history is read.
    ``live_store``: the database whose history, firings and silences are read (default: the config's).
    ``jobs``: how many processes judge the rules from history (default: one per core, for a long
    enough period; ``workers.py``)."""
    store = live_store or loaded.config.store_file()
    kind = plan.PROMETHEUS if prometheus is not None else plan.HISTORY
    plans = plan.plans(loaded, kind, tuple(names))
    now = Now(start)
    out = Backtest(start, end, kind)
    last = end - 1e-6  # the period is [start, end): its last moment is before its end
    if prometheus is not None:
        prometheus.bind(now, [p for p in plans if p.skip is None], start, end)
        out.source_of = (prometheus, now.set)
        for p in plans:
            prometheus.step = p.every  # its range queries step as the rule is evaluated
            out.rules.append(
                RuleResult(p, await judge.judge(p, prometheus, loaded.baseline, start, last, now.set))
            )
    else:
        first, wanted = span(plans, store, start, end)
        out.notes += _held(store, start, end)
        count = workers.jobs_for(plans, start, end, jobs)
        if count > 1:
            live = [p for p in plans if p.skip is None]
            apart = iter(
                await workers.judged_apart(live, count, store, first, start, last, wanted, loaded.baseline)
            )
            for p in plans:
                out.rules.append(RuleResult(p, next(apart) if p.skip is None else judge.Judged(p)))
        else:
            source = history_source(store, first, end, wanted, now)
            out.source_of = (source, now.set)
            for p in plans:
                out.rules.append(
                    RuleResult(p, await judge.judge(p, source, loaded.baseline, start, last, now.set))
                )
        out.history = (store, first, end, wanted, now)
    lives = recorded(store, start, end) if store.exists() else []
    if not store.exists():
        out.notes.append(f"no state database at {store}: no firings recorded live to compare with")
    with tempfile.TemporaryDirectory(prefix="specguard-backtest-") as scratch:
        replay = act.for_replay(loaded, [r.judged for r in out.rules], Path(scratch))
        acted = await act.act(replay, [r.judged for r in out.rules], end, store if store.exists() else None)
    out.silences, out.flags = acted.silences, acted.flags
    runs: dict[str, list[dict[str, Any]]] = {}
    ran: dict[tuple[str, str, str, float], list[dict[str, Any]]] = {}  # an event's runs, by what it was
    for event in acted.events:
        for run in event["runs"]:
            held = acted.held.get((event["id"], run["action"], run["mode"]), [])
            done = {**run, "event": event["kind"], "at": event["at"], "labels": event["labels"], "held": held}
            runs.setdefault(event["rule"], []).append(done)
            ran.setdefault((event["rule"], event["series"], event["kind"], event["at"]), []).append(done)
    episodes = episodes_of([e for r in out.rules for e in r.judged.events], ran)
    out.incidents = list(incidents)
    for result in out.rules:
        result.episodes = episodes.get(result.name, [])
        result.actions = runs.get(result.name, [])
        result.recorded = [r for r in lives if r.rule == result.name]
        result.reproduced = reproduce(result.recorded, result.episodes, result.plan)
        # Scored when something is known of what happened: an incidents file, or what the rule of
        # that name fired live. Without either, a firing is neither caught nor false: unknown.
        if (incidents or result.recorded) and result.plan.skip is None:
            result.score = score(result.name, result.episodes, _for(result.name, incidents, lives, end), end)
    return out


def _utc(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def _for(rule: str, incidents: Sequence[Incident], lives: Sequence[Recorded], end: float) -> list[Incident]:
    """The incidents a rule is scored against: the file's, and the firings recorded live of a rule
    of that name."""
    return [*incidents, *(r.as_incident(end) for r in lives if r.rule == rule)]


def span(plans: Sequence[plan.Plan], store: Path, start: float, end: float) -> tuple[float, Wanted]:
    """Where history must be read from (the longest window before the period) and what of it."""
    from specguard.backtest.judge import moments
    from specguard.daemon.evaluation import window_of
    from specguard.rules.signals import get_signal

    if not store.exists():
        raise BacktestError(f"no state database at {store}: give --state-dir, or replay from Prometheus")
    if not moments(start, end, plan.MINUTE):
        raise BacktestError("the period holds no whole minute")
    live = [p for p in plans if p.skip is None]
    longest = max((window_of(p.item, p.every) for p in live), default=plan.MINUTE)
    first = math.floor((start - longest - plan.MINUTE) / plan.MINUTE) * plan.MINUTE
    return first, components_of(get_signal(p.item.rule.signal) for p in live if p.item.rule.signal)


def history_source(
    store: Path, first: float, end: float, wanted: Wanted, now: Callable[[], float]
) -> HistorySource:
    try:
        return workers.history(store, first, end, wanted, now)
    except sqlite3.Error as exc:
        raise BacktestError(f"cannot read history from {store}: {exc}") from None


def _held(store: Path, start: float, end: float) -> list[str]:
    """What to say when history holds only part of the period, or none of it."""
    try:
        with contextlib.closing(read_only(store)) as db:
            low, high = db.execute(
                "SELECT MIN(minute), MAX(minute) FROM history WHERE minute >= ? AND minute < ?", (start, end)
            ).fetchone()
    except sqlite3.Error as exc:
        raise BacktestError(f"cannot read history from {store}: {exc}") from None
    if low is None:
        return [f"the state database {store} holds no history in the period: nothing to replay"]
    if low > start + plan.MINUTE or high < end - 2 * plan.MINUTE:
        return [
            f"history holds {_utc(low)} to {_utc(high + plan.MINUTE)} UTC of the period only "
            "(its retention, or the daemon not running): the rest reads as no data"
        ]
    return []
