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

from specguard.backtest import act, judge, plan
from specguard.backtest.incidents import Incident, Recorded, recorded, score
from specguard.backtest.result import RuleResult, episodes_of, reproduce
from specguard.config.loading import Loaded
from specguard.sources.base import Source
from specguard.sources.history import HistorySource, components_of
from specguard.sources.history import load as load_history
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
    # The source the rules were judged on and how its clock is set: a calibration replays through it.
    source_of: tuple[Source, Callable[[float], None]] | None = None


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
) -> Backtest:
    """Replay ``loaded``'s rules (or ``names``) over [start, end). ``prometheus``: a source whose
    clock is the replay's (``prometheus_range.RangeSource``), else the store's history is read.
    ``live_store``: the database whose history, firings and silences are read (default: the config's)."""
    store = live_store or loaded.config.store_file()
    kind = plan.PROMETHEUS if prometheus is not None else plan.HISTORY
    plans = plan.plans(loaded, kind, tuple(names))
    now = Now(start)
    out = Backtest(start, end, kind)
    source: Source
    if prometheus is not None:
        source = prometheus
        prometheus.bind(now, [p for p in plans if p.skip is None], start, end)
    else:
        source = _history(plans, store, start, end, now)
        holds = source.held()
        if holds is None:
            out.notes.append(f"the state database {store} holds no history in the period: nothing to replay")
        elif holds[0] > start + plan.MINUTE or holds[1] < end - 2 * plan.MINUTE:
            out.notes.append(
                f"history holds {_utc(holds[0])} to {_utc(holds[1] + plan.MINUTE)} UTC of the period only "
                "(its retention, or the daemon not running): the rest reads as no data"
            )
    out.source_of = (source, now.set)
    for p in plans:
        if prometheus is not None:
            prometheus.step = p.every  # its range queries step as the rule is evaluated
        judged = await judge.judge(p, source, loaded.baseline, start, end - 1e-6, now.set)
        out.rules.append(RuleResult(p, judged))
    lives = recorded(store, start, end) if store.exists() else []
    if not store.exists():
        out.notes.append(f"no state database at {store}: no firings recorded live to compare with")
    with tempfile.TemporaryDirectory(prefix="specguard-backtest-") as scratch:
        replay = act.for_replay(loaded, [r.judged for r in out.rules], Path(scratch))
        acted = await act.act(replay, [r.judged for r in out.rules], end, store if store.exists() else None)
    out.silences, out.flags = acted.silences, acted.flags
    episodes = episodes_of(acted.events, end)
    runs: dict[str, list[dict[str, Any]]] = {}
    for event in acted.events:
        for run in event["runs"]:
            held = acted.held.get((event["id"], run["action"], run["mode"]), [])
            runs.setdefault(event["rule"], []).append({**run, "event": event["kind"], "at": event["at"],
                                                       "labels": event["labels"], "held": held})  # fmt: skip
    every_incident = list(incidents) + [r.as_incident(end) for r in lives]
    out.incidents = list(incidents)
    for result in out.rules:
        result.episodes = episodes.get(result.name, [])
        result.actions = runs.get(result.name, [])
        result.recorded = [r for r in lives if r.rule == result.name]
        result.reproduced = reproduce(result.recorded, result.episodes, result.plan)
        if every_incident and result.plan.skip is None:
            result.score = score(result.name, result.episodes, _for(result.name, incidents, lives, end), end)
    return out


def _utc(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def _for(rule: str, incidents: Sequence[Incident], lives: Sequence[Recorded], end: float) -> list[Incident]:
    """The incidents a rule is scored against: the file's, and the firings recorded live of a rule
    of that name."""
    return [*incidents, *(r.as_incident(end) for r in lives if r.rule == rule)]


def _history(plans: Sequence[plan.Plan], store: Path, start: float, end: float, now: Now) -> HistorySource:
    """The store's history over the period and the longest window before it."""
    from specguard.backtest.judge import moments
    from specguard.daemon.evaluation import window_of
    from specguard.rules.signals import get_signal

    if not store.exists():
        raise BacktestError(f"no state database at {store}: give --state-dir, or replay from Prometheus")
    live = [p for p in plans if p.skip is None]
    longest = max((window_of(p.item, p.every) for p in live), default=plan.MINUTE)
    first = math.floor((start - longest - plan.MINUTE) / plan.MINUTE) * plan.MINUTE
    wanted = components_of(get_signal(p.item.rule.signal) for p in live if p.item.rule.signal)
    try:
        with contextlib.closing(read_only(store)) as db:
            recordings, minutes = load_history(db, first, end, wanted)
    except sqlite3.Error as exc:
        raise BacktestError(f"cannot read history from {store}: {exc}") from None
    if not moments(start, end, plan.MINUTE):
        raise BacktestError("the period holds no whole minute")
    return HistorySource(recordings, first, minutes, now)
