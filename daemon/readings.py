"""What a rule reads: the source's answer for its expression, or for its signal over a window,
grouped and selected as the rule says. Derived signals are computed here, from the signals they are
made of: ``estimated_speedup`` is the mean acceptance length divided by ``1 + k c``, with k read
from vLLM's per-position series and c from the baseline of the series' model."""

from __future__ import annotations

from collections.abc import Mapping

from specguard.config.loading import LoadedRule
from specguard.engine.states import series_key
from specguard.rules.signals import CATALOG, Kind, Signal, get_signal
from specguard.sources.base import Invalid, Source, SourceResult
from specguard.store.baseline import Baseline

NO_BASELINE = (
    "estimated_speedup needs the draft's cost per step: configure a baseline file whose entry for the "
    "model gives speculative.method or speculative.draft_cost"
)


async def read(item: LoadedRule, source: Source, baseline: Baseline | None, window: float) -> SourceResult:
    """The rule's query; or its signal over ``window``."""
    rule = item.rule
    if rule.expr is not None:
        return await source.query_expr(rule.expr)
    assert rule.signal is not None
    return await read_signal(item, get_signal(rule.signal), source, baseline, window)


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
        cost = baseline.draft_cost(series.labels) if baseline is not None else NO_BASELINE
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
