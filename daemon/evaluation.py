"""One rule, evaluated once: query the source, resolve each series' threshold, run the engine.

Shared by the daemon's rounds and ``specguard eval``. Derived signals are computed here, from the
signals they are made of: ``estimated_speedup`` is the mean acceptance length divided by
``1 + k c``, with k read from vLLM's per-position series and c from the baseline of the series' model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from specguard.config.loading import LoadedRule
from specguard.daemon.alertmanager.book import AlertBook, Receipt
from specguard.engine import detection
from specguard.engine.states import Outcome, RuleSpec, Threshold, ThresholdFor, evaluate, series_key
from specguard.rules.conditions import MissingBaseline
from specguard.rules.signals import CATALOG, Kind, Signal, get_signal
from specguard.sources.base import Invalid, Source, SourceResult
from specguard.store.baseline import Baseline
from specguard.store.records import SCHEDULE, SeriesState, State

log = logging.getLogger("specguard")

FORGET_AFTER_WINDOWS = 5  # a series absent for 5 windows is forgotten, unless the rule says otherwise
DETECTOR_FORGET_AFTER = 7 * 86400.0  # a detector's series: a week


def spec_of(item: LoadedRule, interval: float) -> RuleSpec:
    rule = item.rule
    every = rule.interval or interval
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


def window_of(item: LoadedRule, interval: float) -> float:
    """The window a rule reads: its own, or for a detector one interval (a window per evaluation)."""
    rule = item.rule
    return (rule.interval or interval) if rule.detect is not None else rule.window


def thresholds(item: LoadedRule, baseline: Baseline | None) -> Threshold | ThresholdFor:
    """The number to compare with; or, for a baseline-relative condition, one per series (the
    baseline entry of the series' model); or why it cannot be known at all."""
    condition = item.rule.test
    if (
        item.rule.signal is not None
        and get_signal(item.rule.signal).kind is Kind.SPEEDUP
        and baseline is None
    ):
        return _NO_BASELINE
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


async def read_signal(
    item: LoadedRule, signal: Signal, source: Source, baseline: Baseline | None, window: float
) -> SourceResult:
    """The rule's signal over ``window``, grouped and selected as the rule says."""
    if signal.kind is not Kind.SPEEDUP:
        return await source.query_signal(signal, window, item.group_by, item.matchers, item.keep_intrinsic)
    length, positions = [
        await source.query_signal(CATALOG[name], window, item.group_by, item.matchers, item.keep_intrinsic)
        for name in signal.inputs
    ]
    return speedup(signal, length, positions, baseline)


def speedup(
    signal: Signal, length: SourceResult, positions: SourceResult, baseline: Baseline | None
) -> SourceResult:
    """mean acceptance length / (1 + k c), series by series (Leviathan et al., Theorem 3.8)."""
    failed = length.error or positions.error
    if failed is not None:
        return SourceResult.failed(failed)
    k_of = {series_key(series.labels): series.value for series in positions.series}
    good: list[tuple[Mapping[str, str], float]] = []
    bad: list[Invalid] = [*length.invalid, *positions.invalid]
    for series in length.series:
        k = k_of.get(series_key(series.labels))
        if k is None:
            continue  # no per-position series: no data
        cost = baseline.draft_cost(series.labels) if baseline is not None else _NO_BASELINE
        if isinstance(cost, str):
            bad.append(Invalid(series.labels, cost))
            continue
        good.append((series.labels, series.value / (1 + k * cost)))
    checked = SourceResult.checked(signal, good, length.warming | positions.warming)
    return SourceResult(
        series=checked.series,
        invalid=(*checked.invalid, *bad),
        warming=checked.warming,
        detail=dict(length.detail),
    )


_NO_BASELINE = (
    "estimated_speedup needs the draft's cost per step: configure a baseline file whose entry for the "
    "model gives speculative.method or speculative.draft_cost"
)


NO_ALERTS = (
    "an alert rule is fed by Alertmanager's webhook: `specguard run` receives its alerts "
    "(`eval --alerts FILE` evaluates it on a saved delivery)"
)


async def query(
    item: LoadedRule, source: Source, baseline: Baseline | None = None, interval: float | None = None
) -> SourceResult:
    """The rule's query over its window (a detector's: one ``interval``, the config's by default)."""
    rule = item.rule
    if rule.expr is not None:
        return await source.query_expr(rule.expr)
    assert rule.signal is not None
    window = window_of(item, interval if interval is not None else rule.window)
    return await read_signal(item, get_signal(rule.signal), source, baseline, window)


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


def _say_warmups(rule: str, judged: detection.Judged) -> None:
    """What the warm-ups' checks found, once each: the first check of a run that finds a shift, the
    calibration that ends such a run, a warm-up let go on an upgrade."""
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
) -> tuple[Outcome, SourceResult]:
    """The engine's outcome, and the source's answer it was computed from.

    An alert rule reads ``alerts`` and its outcome holds only the series it evaluated (see
    evaluate_alert_rule); ``trigger`` says what asked for this evaluation.
    """
    if item.rule.alert_only:
        if alerts is None:
            failed = SourceResult.failed(NO_ALERTS)
            return evaluate(spec_of(item, interval), failed, 0.0, previous, now, trigger), failed
        return evaluate_alert_rule(item, alerts, previous, now, interval, trigger, touched), SourceResult()
    detect = item.rule.detect
    if detect is not None:
        every = item.rule.interval or interval
        answer = await query(item, source, baseline, every)
        judged = detection.judge(detect, every, answer, previous, baseline, now)
        for key, why in judged.recalibrated.items():
            # Once: the new state keeps the settings it is measured under.
            log.warning(
                "%s: series %s warms up again: %s, so its phi and in_control were measured on other windows",
                item.name,
                key,
                why,
                extra={"rule": item.name, "labels": json.loads(key)},
            )
        _say_warmups(item.name, judged)
        h = detection.h_of(detect, every)
        outcome = evaluate(spec_of(item, interval), judged.result, h, previous, now, trigger)
        return detection.settle(outcome, judged, previous, now), answer
    threshold = thresholds(item, baseline)
    result = (
        await query(item, source, baseline, interval) if not isinstance(threshold, str) else SourceResult()
    )
    return evaluate(spec_of(item, interval), result, threshold, previous, now, trigger), result
