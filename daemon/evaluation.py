"""One rule, evaluated once: the rule in the engine's terms, what it reads, the engine's judgement.

Shared by the daemon's rounds and ``specguard eval``. ``evaluate_rule`` reads top to bottom and
calls only downwards: the rule's spec and threshold (here), its reading (``readings``: the source's
answer, and derived signals such as estimated_speedup), then the pure engine: ``engine.states``
for a rule with a condition; for a ``detect:`` rule ``engine.detection``, which steps each series'
detector and has ``engine.states`` judge its statistic. What the detectors' warm-ups found is said
last. An alert rule reads the alert book instead of the source.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from typing import Any

from specguard.config.loading import LoadedRule
from specguard.daemon.alertmanager.book import AlertBook, Receipt
from specguard.daemon.readings import NO_BASELINE, read
from specguard.engine import detection
from specguard.engine.states import Outcome, RuleSpec, Threshold, ThresholdFor, evaluate
from specguard.rules.conditions import MissingBaseline
from specguard.rules.signals import Kind, get_signal
from specguard.sources.base import Source, SourceResult
from specguard.store.baseline import Baseline
from specguard.store.records import SCHEDULE, SeriesState, State

log = logging.getLogger("specguard")

FORGET_AFTER_WINDOWS = 5  # a series absent for 5 windows is forgotten, unless the rule says otherwise
DETECTOR_FORGET_AFTER = 7 * 86400.0  # a detector's series: a week

NO_ALERTS = (
    "an alert rule is fed by Alertmanager's webhook: `specguard run` receives its alerts "
    "(`eval --alerts FILE` evaluates it on a saved delivery)"
)


async def evaluate_rule(
    item: LoadedRule,
    source: Source,
    baseline: Baseline | None,
    previous: Mapping[str, SeriesState],
    now: float,
    interval: float,
    alerts: AlertBook | None = None,
    trigger: str = SCHEDULE,
    touched: Iterable[Receipt] | None = None,
    ahead: Awaitable[SourceResult] | None = None,
) -> tuple[Outcome, SourceResult]:
    """The engine's outcome, and the source's answer it was computed from.

    An alert rule reads ``alerts`` and its outcome holds only the series it evaluated (see
    evaluate_alert_rule); ``trigger`` says what asked for this evaluation; ``ahead``: the reading
    ``reading_of`` gave, asked for before (a round asks for all its rules' readings at once).
    """
    if item.rule.alert_only:
        if alerts is None:
            failed = SourceResult.failed(NO_ALERTS)
            return evaluate(spec_of(item, interval), failed, 0.0, previous, now, trigger), failed
        return evaluate_alert_rule(item, alerts, previous, now, interval, trigger, touched), SourceResult()
    spec = spec_of(item, interval)
    if ahead is None:
        ahead = reading_of(item, source, baseline, interval)
    reading = await ahead if ahead is not None else SourceResult()
    detect = item.rule.detect
    if detect is not None:  # one window per evaluation: the rule's interval
        window = window_of(item, interval)
        outcome, judged = detection.evaluate(detect, window, spec, reading, previous, baseline, now, trigger)
        _say_detectors(item.name, judged)
        return outcome, reading
    return evaluate(spec, reading, thresholds(item, baseline), previous, now, trigger), reading


def reading_of(
    item: LoadedRule, source: Source, baseline: Baseline | None, interval: float
) -> Coroutine[Any, Any, SourceResult] | None:
    """What ``evaluate_rule`` reads from the source for ``item`` (a round asks for it ahead); None
    when it reads nothing there: an alert rule, or a threshold that cannot be known (the rule's
    error is then the missing baseline, and nothing is read)."""
    if item.rule.alert_only:
        return None
    if item.rule.detect is None and isinstance(thresholds(item, baseline), str):
        return None
    return read(item, source, baseline, window_of(item, interval))


def window_of(item: LoadedRule, interval: float) -> float:
    """The window a rule reads: its own, or for a detector one interval (a window per evaluation)."""
    rule = item.rule
    return item.every(interval) if rule.detect is not None else rule.window


def spec_of(item: LoadedRule, interval: float) -> RuleSpec:
    rule = item.rule
    every = item.every(interval)
    window = window_of(item, interval)
    forget_after = FORGET_AFTER_WINDOWS * window
    if rule.detect is not None:
        # A detector's series keeps its calibration: forgetting it after a quiet spell (traffic
        # moved to the fallback) would mean another warm-up.
        forget_after = max(forget_after, DETECTOR_FORGET_AFTER)
    return RuleSpec(
        name=rule.name,
        condition=rule.test if rule.detect is None else detection.condition_of(rule.detect, every),
        for_seconds=rule.for_,
        keep_firing_for=rule.keep_firing_for,
        consecutive=rule.consecutive,
        no_data=rule.no_data,
        # Data normally comes every interval; a longer silence than a window on top of that is a gap.
        max_gap=window + every,
        forget_after=rule.forget_after if rule.forget_after is not None else forget_after,
    )


def thresholds(item: LoadedRule, baseline: Baseline | None) -> Threshold | ThresholdFor:
    """The number to compare with; or, for a baseline-relative condition, one per series (the
    baseline entry of the series' model); or why it cannot be known at all."""
    condition = item.rule.test
    if (
        item.rule.signal is not None
        and get_signal(item.rule.signal).kind is Kind.SPEEDUP
        and baseline is None
    ):
        return NO_BASELINE
    if condition.baseline_signal is None:
        return condition.threshold(None)
    if baseline is None:
        try:
            return condition.threshold(None)
        except MissingBaseline as exc:
            return str(exc)
    assert condition.baseline_signal is not None
    name = condition.baseline_signal

    def per_series(labels: Mapping[str, str]) -> Threshold:
        value = baseline.value(labels, name)
        return value if isinstance(value, str) else condition.factor * value

    return per_series


def evaluate_alert_rule(
    item: LoadedRule,
    alerts: AlertBook,
    previous: Mapping[str, SeriesState],
    now: float,
    interval: float,
    trigger: str = SCHEDULE,
    touched: Iterable[Receipt] | None = None,
) -> Outcome:
    """An alert rule, on the series that can change, so that its cost follows what happens and not
    how many alerts are known: on a delivery, the series its alerts belong to (``touched``); on the
    schedule, series new to the rule and series whose state and alerts disagree or whose clocks
    run (pending; firing on resolved alerts, through keep_firing_for; not firing on a firing alert,
    as after a delivery whose evaluation could not be stored; gone quiet, towards forget_after). A
    series firing on a firing alert, or ok with its alerts resolved, cannot change with time alone
    and is left as it is.

    The outcome holds only the series evaluated: merge it into ``previous``.
    """
    if touched is not None:
        keys = alerts.keys_of(item, touched)
    else:
        present = alerts.keys(item)
        firing = alerts.firing_keys(item)
        keys = {key for key in present if key not in previous}
        moving = (
            key
            for key, series in previous.items()
            if key not in present
            or series.state is State.PENDING
            or (series.state is State.FIRING) != (key in firing)  # firing on ok, or ok on firing
        )
        keys.update(moving)
    result = alerts.query(item, keys)
    before = {key: previous[key] for key in keys if key in previous}
    return evaluate(spec_of(item, interval), result, thresholds(item, None), before, now, trigger)


def _say_detectors(rule: str, judged: detection.Judged) -> None:
    """What the detectors found, once each: a calibration that no longer applies (the new state keeps
    the settings it is measured under), and the warm-ups' checks: the first check of a run that
    finds a shift, the calibration that ends such a run, a warm-up let go on an upgrade."""
    for key, why in judged.recalibrated.items():
        log.warning(
            "%s: series %s warms up again: %s, so its phi and in_control were measured on other windows",
            rule, key, why, extra={"rule": rule, "labels": json.loads(key)},
        )  # fmt: skip
    for key, why in judged.restarted.items():
        log.warning(
            "%s: series %s starts its warm-up again: %s",
            rule, key, why, extra={"rule": rule, "labels": json.loads(key)},
        )  # fmt: skip
    for key, why in judged.unsettled.items():
        log.warning(
            "%s: series %s does not calibrate: its warm-up is not homogeneous: %s",
            rule, key, why, extra={"rule": rule, "labels": json.loads(key)},
        )  # fmt: skip
    for key, how in judged.settled.items():
        log.info(
            "%s: series %s calibrates: %s",
            rule, key, how, extra={"rule": rule, "labels": json.loads(key)},
        )  # fmt: skip
