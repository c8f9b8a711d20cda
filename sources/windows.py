"""What a signal's query computes over windows of samples, with Prometheus's semantics: label
matchers, ``sum by`` aggregation, the ``> 0`` filter on denominators, counter resets and
``histogram_quantile`` over the buckets' increases. The scrape source runs it over its rings;
``signal_over`` runs it over samples taken elsewhere.

One deliberate difference: ``rate`` is the increase between the first and the last sample in the
window divided by the time between them, with no extrapolation. Prometheus extrapolates the
increase towards the window edges and divides by the whole window, which gives about the same
per-second value; and as series of one target share their scrape times, the factor is the same
for numerator and denominator, so ratios, per-position shares and quantiles do not change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise

from specguard.rules.matchers import Matcher, all_match
from specguard.rules.signals import Kind, Metric, Signal
from specguard.sources.base import ChainCounts, SourceResult
from specguard.sources.quantiles import bucket_quantile
from specguard.store.exposition import Labels, Snapshot

_Point = tuple[float, float]  # (timestamp, value)
Window = list[tuple[float, Snapshot]]  # one target's samples, oldest first
_Key = tuple[str, ...]  # values of the group-by labels, "" where a label is absent
_Item = tuple[dict[str, str], float]
_Match = tuple[Matcher, ...]


def signal_over(
    signal: Signal,
    samples: Mapping[str, Sequence[tuple[float, Snapshot]]],
    group_by: Sequence[str],
) -> SourceResult:
    """``signal`` over samples taken elsewhere, per ``group_by``: what a rule's query computes over
    a window that holds exactly these samples of each target (``samples`` by ``instance``), with the
    same code (``histogram_quantile`` over the buckets' increases for a quantile, counter resets,
    the sum over engines). For a tool that reads ``/metrics`` itself, as ``specguard bench`` does
    before and after each phase, so that its figures are the ones the rules compare with."""
    if signal.kind is Kind.CHAIN:
        raise ValueError(f"{signal.name} needs the scrape source's edge samples: query the source")
    windows = {instance: sorted(points, key=lambda point: point[0]) for instance, points in samples.items()}
    return SourceResult.checked(signal, evaluate(signal, windows, signal.groups(group_by), ()))


def evaluate(signal: Signal, windows: Mapping[str, Window], groups: list[str], match: _Match) -> list[_Item]:
    """``signal``'s series over each instance's window (``windows`` by ``instance``), by ``groups``,
    of the series ``match`` selects: what its query computes."""
    if signal.kind is Kind.RATIO or (signal.kind is Kind.PER_POSITION and "position" not in groups):
        assert signal.denominator is not None
        num = _sum_by(_rates(windows, signal.metric, match), groups)
        den = _sum_by(_rates(windows, signal.denominator, _without(match, "position")), groups)
        # `num / (den > 0)`: a group without drafts in the window has no value, not NaN or 0.
        return [
            (_labels(groups, key), signal.offset + value / den[key])
            for key, value in num.items()
            if den.get(key, 0.0) > 0
        ]
    if signal.kind is Kind.PER_POSITION:
        assert signal.denominator is not None
        outer = [g for g in groups if g not in signal.intrinsic_labels]
        num = _sum_by(_rates(windows, signal.metric, match), groups)
        den = _sum_by(_rates(windows, signal.denominator, _without(match, "position")), outer)
        items = []
        for key, value in num.items():  # `on (outer) group_left ()`: one denominator per group
            labels = _labels(groups, key)
            drafts = den.get(tuple(labels.get(g, "") for g in outer), 0.0)
            if drafts > 0:
                items.append((labels, value / drafts))
        return items
    if signal.kind is Kind.QUANTILE:
        assert signal.quantile is not None
        return _quantiles(signal.quantile, _rates(windows, signal.metric, match, "_bucket"), groups)
    if signal.kind is Kind.GAUGE:
        return _combine_by(_averages(windows, signal.metric, match), groups, signal.combine)
    if signal.kind is Kind.RATE:
        totals = _sum_by(_rates(windows, signal.metric, match), groups)
        return [(_labels(groups, key), value) for key, value in totals.items()]
    if signal.kind is Kind.POSITIONS:
        return _positions(windows, signal.metric, match, groups)
    raise ValueError(f"{signal.name} is derived from {', '.join(signal.inputs)}: not a source query")


def in_window(ring: Iterable[tuple[float, Snapshot]], start: float, end: float, edge: bool) -> Window:
    """The ring's samples in [start, end]. With ``edge``: those in (start, end] after the last one
    at or before ``start``, so that windows (a, b] and (b, c] share exactly one sample."""
    if not edge:
        return [(ts, snap) for ts, snap in ring if start <= ts <= end]
    inside: Window = []
    before: tuple[float, Snapshot] | None = None
    for ts, snap in ring:
        if ts <= start:
            before = (ts, snap)
        elif ts <= end:
            inside.append((ts, snap))
    return [before, *inside] if before is not None and inside else inside


def chain_counts(
    signal: Signal, windows: Mapping[str, Window], groups: list[str], match: _Match
) -> list[ChainCounts]:
    """Per group: accepted tokens, trials (accepted + drafts - drafts accepted whole), draft tokens
    and drafts x k, engine by engine, as counter increases over each target's window."""
    assert signal.denominator is not None and signal.per_position is not None
    assert signal.draft_tokens is not None
    match = _without(match, "position")
    accepted = _sum_by(_increases(windows, signal.metric, match), groups)
    drafts_by_engine = _increases(windows, signal.denominator, match)
    drafts = _sum_by(drafts_by_engine, groups)
    tokens = _sum_by(_increases(windows, signal.draft_tokens, match), groups)
    # Per engine (every label but the position): the last position's count is the smallest, and
    # the number of positions is k.
    full: dict[tuple[tuple[str, str], ...], float] = {}
    positions: dict[tuple[tuple[str, str], ...], int] = {}
    labels_of: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for labels, value in _increases(windows, signal.per_position, match):
        engine = {k: v for k, v in labels.items() if k != "position"}
        key = tuple(sorted(engine.items()))
        full[key] = min(full.get(key, math.inf), value)
        positions[key] = positions.get(key, 0) + 1
        labels_of[key] = engine
    whole = _sum_by(((labels_of[key], value) for key, value in full.items()), groups)
    expected: dict[_Key, float] = {}
    for labels, value in drafts_by_engine:
        k = positions.get(tuple(sorted(labels.items())), 0)
        group = _key(labels, groups)
        expected[group] = expected.get(group, 0.0) + value * k
    return [
        ChainCounts(
            _labels(groups, key),
            successes=value,
            trials=value + drafts.get(key, 0.0) - whole.get(key, 0.0),
            draft_tokens=tokens.get(key, 0.0),
            expected_tokens=expected.get(key, 0.0),
        )
        for key, value in accepted.items()
        if drafts.get(key, 0.0) > 0
    ]


def _series(window: Window, metric: Metric, suffix: str) -> dict[Labels, list[_Point]]:
    """Every series of ``metric`` in one target's window, under the name the target exposes now."""
    if not window:
        return {}
    newest = window[-1][1]
    name = next((n + suffix for n in metric.names if n + suffix in newest), None)
    if name is None:
        return {}
    series: dict[Labels, list[_Point]] = {}
    for ts, snapshot in window:
        for labels, value in snapshot.get(name, {}).items():
            series.setdefault(labels, []).append((ts, value))
    return series


def _with_instance(labels: Labels, instance: str) -> dict[str, str]:
    out = dict(labels)
    if "instance" in out:  # Prometheus (honor_labels: false) keeps a target's own as exported_
        out["exported_instance"] = out.pop("instance")
    out["instance"] = instance
    return out


def _rates(windows: Mapping[str, Window], metric: Metric, match: _Match, suffix: str = "") -> list[_Item]:
    return _counted(windows, metric, match, suffix, counter_rate)


def _increases(windows: Mapping[str, Window], metric: Metric, match: _Match) -> list[_Item]:
    return _counted(windows, metric, match, "", counter_increase)


def _counted(
    windows: Mapping[str, Window],
    metric: Metric,
    match: _Match,
    suffix: str,
    measure: Callable[[Sequence[_Point]], float],
) -> list[_Item]:
    items = []
    for instance, window in windows.items():
        for labels, points in _series(window, metric, suffix).items():
            full = _with_instance(labels, instance)
            if len(points) >= 2 and all_match(match, full):  # a rate needs two samples
                items.append((full, measure(points)))
    return items


def _averages(windows: Mapping[str, Window], metric: Metric, match: _Match) -> list[_Item]:
    items = []
    for instance, window in windows.items():
        for labels, points in _series(window, metric, "").items():
            full = _with_instance(labels, instance)
            if all_match(match, full):
                values = [value for _, value in points]
                items.append((full, sum(values) / len(values)))
    return items


def _positions(
    windows: Mapping[str, Window], metric: Metric, match: _Match, groups: Sequence[str]
) -> list[_Item]:
    """``max by (groups) (count by (instance, engine, groups) (metric))`` on the newest sample."""
    per_engine: dict[_Key, int] = {}
    inner = list(dict.fromkeys(["instance", "engine", *groups]))
    for instance, window in windows.items():
        if not window:
            continue
        newest = window[-1][1]
        name = next((n for n in metric.names if n in newest), None)
        for labels in newest.get(name, {}) if name else {}:
            full = _with_instance(labels, instance)
            if all_match(match, full):
                key = _key(full, inner)
                per_engine[key] = per_engine.get(key, 0) + 1
    most: dict[_Key, float] = {}
    for key, count in per_engine.items():
        group = _key(_labels(inner, key), groups)
        most[group] = max(most.get(group, 0.0), float(count))
    return [(_labels(groups, key), value) for key, value in most.items()]


def _without(match: _Match, label: str) -> _Match:
    return tuple(m for m in match if m.label != label)


def counter_increase(points: Sequence[_Point]) -> float:
    """Increase of a counter over ``points`` (sorted, >= 2), resets included: as Prometheus counts
    it (last - first, plus the value before every decrease, a decrease being a restart from 0),
    without Prometheus's extrapolation to the window edges."""
    increase = points[-1][1] - points[0][1]
    for (_, previous), (_, current) in pairwise(points):
        if current < previous:
            increase += previous
    return increase


def counter_rate(points: Sequence[_Point]) -> float:
    """Per-second increase of a counter over ``points`` (sorted, >= 2), resets included."""
    return counter_increase(points) / (points[-1][0] - points[0][0])


def _key(labels: Mapping[str, str], groups: Sequence[str]) -> _Key:
    return tuple(labels.get(g, "") for g in groups)


def _labels(groups: Sequence[str], key: _Key) -> dict[str, str]:
    # An empty value is an absent label in Prometheus: leave it out.
    return {g: v for g, v in zip(groups, key, strict=True) if v}


def _sum_by(items: Iterable[_Item], groups: Sequence[str]) -> dict[_Key, float]:
    totals: dict[_Key, float] = {}
    for labels, value in items:
        key = _key(labels, groups)
        totals[key] = totals.get(key, 0.0) + value
    return totals


def _combine_by(items: Iterable[_Item], groups: Sequence[str], combine: str) -> list[_Item]:
    """``max by`` or ``sum by`` (groups) of per-series values."""
    totals: dict[_Key, list[float]] = {}
    for labels, value in items:
        totals.setdefault(_key(labels, groups), []).append(value)
    pick = max if combine == "max" else sum
    return [(_labels(groups, key), float(pick(vals))) for key, vals in totals.items()]


def _quantiles(q: float, bucket_rates: Iterable[_Item], groups: Sequence[str]) -> list[_Item]:
    """``histogram_quantile(q, sum by (groups, le) (rate(x_bucket[w])))``."""
    groups = [g for g in groups if g != "le"]
    histograms: dict[_Key, list[tuple[float, float]]] = {}
    for key, value in _sum_by(bucket_rates, [*groups, "le"]).items():
        try:
            upper = float(key[-1])
        except ValueError:  # Prometheus skips buckets without a parsable `le`
            continue
        if not math.isnan(upper):
            histograms.setdefault(key[:-1], []).append((upper, value))
    return [(_labels(groups, key), bucket_quantile(q, b)) for key, b in histograms.items()]
