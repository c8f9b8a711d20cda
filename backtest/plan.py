"""How each rule is replayed, and what its replay cannot show, said per rule.

From the store's history a rule reads whole minutes (``sources/history.py``), so it is evaluated
once a minute at most; a rule evaluated more often live is replayed once a minute, and a detector's
windows shorter than a minute become one-minute windows (its h follows from its interval). From
Prometheus a rule is replayed as it runs: its own interval and window, its PromQL evaluated at each
moment. What cannot be replayed at all (an alert rule; raw PromQL or a signal history does not keep,
from history) is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from specguard.config.loading import Loaded, LoadedRule
from specguard.engine import detection
from specguard.rules.durations import format_duration
from specguard.rules.signals import get_signal
from specguard.sources.history import KEPT_LABELS, POSITION, not_kept

MINUTE = 60.0
HISTORY = "history"
PROMETHEUS = "prometheus"


@dataclass(frozen=True)
class Plan:
    """One rule as the backtest replays it."""

    item: LoadedRule  # the rule as replayed (a detector's interval may be a minute here)
    live_every: float  # how often the daemon evaluates it
    every: float  # how often the replay evaluates it
    notes: tuple[str, ...] = ()  # what the replay's timing or values cannot match, and by how much
    skip: str | None = None  # why it is not replayed at all

    @property
    def name(self) -> str:
        return self.item.name


def plans(loaded: Loaded, source: str, names: tuple[str, ...] = ()) -> list[Plan]:
    """Every enabled rule (or those ``names``), in the config's order, as ``source`` replays it."""
    interval = loaded.config.interval
    out = []
    for item in loaded.enabled_rules():
        if names and item.name not in names:
            continue
        out.append(plan(item, interval, source))
    return out


def plan(item: LoadedRule, interval: float, source: str) -> Plan:
    rule = item.rule
    live = item.every(interval)
    if rule.alert_only:
        return Plan(
            item,
            live,
            live,
            skip="an alert rule is fed by Alertmanager's deliveries: none are recorded to replay",
        )
    if source == PROMETHEUS:
        return Plan(item, live, live)
    if rule.expr is not None:
        return Plan(
            item, live, live, skip="a rule on raw PromQL replays only from Prometheus (--from-prometheus URL)"
        )
    assert rule.signal is not None
    signal = get_signal(rule.signal)
    why = not_kept(signal)
    if why is not None:
        return Plan(item, live, live, skip=why)
    unkept = sorted(
        {g for g in item.group_by if g not in KEPT_LABELS and g != POSITION}
        | {m.label for m in item.matchers if m.label not in KEPT_LABELS and m.label != POSITION}
    )
    if unkept:
        return Plan(
            item, live, live,
            skip=f"history keeps series by instance and model_name only, and this rule groups or selects by "
            f"{', '.join(unkept)}: replay it from Prometheus",
        )  # fmt: skip
    if rule.detect is not None:
        return _detector(item, live)
    return _threshold(item, live)


def _minutes(seconds: float) -> float:
    """``seconds`` up to whole minutes (at least one)."""
    return max(1, math.ceil(seconds / MINUTE - 1e-9)) * MINUTE


def _threshold(item: LoadedRule, live: float) -> Plan:
    rule = item.rule
    notes = ["history keeps minutes: a minute's data are judged at the minute's end, so a firing "
             "shows within a minute of when the daemon saw it"]  # fmt: skip
    read = _minutes(rule.window)
    if rule.window < MINUTE:
        notes.append(
            f"window {format_duration(rule.window)} reads the last whole minute: a dip shorter than a minute is "
            "averaged away"
        )
    elif read != rule.window:
        notes.append(f"window {format_duration(rule.window)} reads the {format_duration(read)} that cover it")
    every = live if live >= MINUTE else MINUTE
    if live < MINUTE:
        notes.append(
            f"evaluated once a minute, not every {format_duration(live)}: `for` holds to within a minute"
        )
        if rule.consecutive > 1:
            late = (rule.consecutive - 1) * (MINUTE - live)
            notes.append(
                f"`consecutive: {rule.consecutive}` counts minutes here: a firing up to "
                f"{format_duration(late)} later than live"
            )
    return Plan(item, live, every, tuple(notes))


def _detector(item: LoadedRule, live: float) -> Plan:
    rule = item.rule
    detect = rule.detect
    assert detect is not None
    every = _minutes(live)
    if every == live:
        return Plan(item, live, live, ("history keeps minutes: a window is judged at its last minute's end",))
    replayed = dataclasses.replace(item, rule=rule.model_copy(update={"interval": every}))
    h_live = detection.condition_of(detect, live).threshold(None)
    h_here = detection.condition_of(detect, every).threshold(None)
    notes = (
        f"its {format_duration(live)} windows are replayed as {format_duration(every)} windows (history keeps "
        f"minutes): h = {h_here:.2f} here against {h_live:.2f} live for the same false-alarm rate, phi is learned "
        f"on {format_duration(every)} windows, and no firing comes sooner than {format_duration(every)} after a drop",
        f"the warm-up ({format_duration(detect.warmup)}) starts at the period's start, as for a daemon started then",
    )
    return Plan(replayed, live, every, notes)
