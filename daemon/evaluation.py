"""One rule, evaluated once: query the source, resolve the threshold, run the engine."""

from __future__ import annotations

from collections.abc import Mapping

from daemon.config import Baseline
from daemon.engine import Outcome, RuleSpec, SeriesState, evaluate
from daemon.loading import LoadedRule
from daemon.signals import get_signal
from daemon.sources.base import Source, SourceResult
from rules.conditions import MissingBaseline


def spec_of(item: LoadedRule) -> RuleSpec:
    rule = item.rule
    return RuleSpec(
        name=rule.name,
        condition=rule.condition,
        for_seconds=rule.for_,
        keep_firing_for=rule.keep_firing_for,
        consecutive=rule.consecutive,
        no_data=rule.no_data,
    )


def threshold_of(item: LoadedRule, baseline: Baseline | None) -> float | str:
    """The threshold, or an error message when the baseline it needs is missing."""
    try:
        return item.rule.condition.threshold(baseline.signals if baseline else None)
    except MissingBaseline as exc:
        return str(exc)


async def query(item: LoadedRule, source: Source) -> SourceResult:
    rule = item.rule
    if rule.expr is not None:
        return await source.query_expr(rule.expr)
    assert rule.signal is not None
    return await source.query_signal(get_signal(rule.signal), rule.window, item.group_by)


async def evaluate_rule(
    item: LoadedRule,
    source: Source,
    baseline: Baseline | None,
    previous: Mapping[str, SeriesState],
    now: float,
) -> tuple[Outcome, SourceResult]:
    """The engine's outcome, and the source's answer it was computed from."""
    threshold = threshold_of(item, baseline)
    result = await query(item, source) if not isinstance(threshold, str) else SourceResult()
    return evaluate(spec_of(item), result, threshold, previous, now), result
