"""What a signal is: its kind, the metrics it reads, and the PromQL it runs (``Signal.promql``).

The catalog (``rules/signals.py``) names every signal with these; both sources compute what a
``Signal`` describes, the Prometheus source as its PromQL, the scrape source from its own samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from specguard.rules.durations import format_duration
from specguard.rules.matchers import Matcher


class Kind(StrEnum):
    RATIO = "ratio"  # offset + rate(numerator) / rate(denominator), per group
    PER_POSITION = "per_position"  # rate(numerator) by position / rate(denominator)
    QUANTILE = "quantile"  # histogram_quantile over rate(buckets)
    GAUGE = "gauge"  # average of a gauge over the window, combined across series by `combine`
    RATE = "rate"  # per-second rate of a counter
    POSITIONS = "positions"  # how many distinct `position` values a counter has (per engine, max)
    SPEEDUP = "speedup"  # derived: mean acceptance length / (1 + k c), computed by the evaluation
    CHAIN = "chain"  # the chain model's per-token acceptance: accepted / (accepted + drafts - full drafts)


@dataclass(frozen=True)
class Metric:
    """One metric as exposed on a ``/metrics`` page (vLLM's or the router's), newest name first.

    ``names`` are exposition names: counters with ``_total``, histograms without ``_bucket``.
    ``since`` documents the vLLM version range of each name, in the same order.
    """

    names: tuple[str, ...]
    since: tuple[str, ...]
    type: str  # counter | gauge | histogram

    def __post_init__(self) -> None:
        if len(self.names) != len(self.since):
            raise ValueError("every metric name needs its version note")


@dataclass(frozen=True)
class Signal:
    name: str
    description: str
    unit: str  # ratio | seconds | tokens | per_second | requests | tokens_per_second
    kind: Kind
    metric: Metric  # numerator, histogram, gauge or counter
    denominator: Metric | None = None
    offset: float = 0.0
    quantile: float | None = None
    intrinsic_labels: tuple[str, ...] = ()  # labels the signal keeps unless a rule's group_by drops them
    requires_speculation: bool = False
    notes: tuple[str, ...] = field(default=())
    combine: str = "sum"  # GAUGE: how per-series averages combine within a group (max | sum)
    domain: tuple[float, float] = (0.0, math.inf)  # the values a vLLM can give, bounds included
    inputs: tuple[str, ...] = ()  # SPEEDUP: the signals it is computed from
    # CHAIN: the per-position counter (its last position counts the drafts accepted whole) and the
    # draft-token counter (drafts shorter than k make the estimate biased: checked, never hidden).
    per_position: Metric | None = None
    draft_tokens: Metric | None = None

    def groups(self, group_by: Sequence[str], keep_intrinsic: bool = True) -> list[str]:
        """The labels a result keeps: ``group_by``, plus the intrinsic ones unless told otherwise."""
        return _unique([*group_by, *(self.intrinsic_labels if keep_intrinsic else ())])

    def out_of_domain(self, value: float) -> str | None:
        """Why ``value`` cannot be this signal's, or None when it can."""
        low, high = self.domain
        if math.isnan(value) or math.isinf(value):
            return f"{self.name} is {value} (not a number vLLM can give)"
        if value < low or value > high:
            span = f">= {_number(low)}" if math.isinf(high) else f"in [{_number(low)}, {_number(high)}]"
            return f"{self.name} = {value:.6g} is impossible (must be {span}): check the target's /metrics"
        return None

    def promql(
        self,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> str:
        """The PromQL expression computing this signal over ``window`` seconds, per ``group_by``.

        ``match`` selects the raw series first (``{position="0"}``). Raises ValueError for a
        signal that is not one query (a derived signal).
        """
        rng = format_duration(window)
        groups = self.groups(group_by, keep_intrinsic)
        sel = "{" + ", ".join(m.promql() for m in match) + "}" if match else ""
        if self.kind is Kind.RATIO or (self.kind is Kind.PER_POSITION and "position" not in groups):
            assert self.denominator is not None
            numerator = _sum_rate(self.metric, rng, groups, sel)
            expr = (
                f"{numerator} / ({_sum_rate(self.denominator, rng, groups, _without(match, 'position'))} > 0)"
            )
            return f"{_number(self.offset)} + {expr}" if self.offset else expr
        if self.kind is Kind.PER_POSITION:
            assert self.denominator is not None
            outer_groups = [g for g in groups if g not in self.intrinsic_labels]
            outer = ", ".join(outer_groups)
            denominator = _sum_rate(self.denominator, rng, outer_groups, _without(match, "position"))
            return (
                f"{_sum_rate(self.metric, rng, groups, sel)} / on ({outer}) group_left () ({denominator} > 0)"
            )
        if self.kind is Kind.QUANTILE:
            assert self.quantile is not None
            by = ", ".join([*groups, "le"])
            parts = [f"sum by ({by}) (rate({name}_bucket{sel}[{rng}]))" for name in self.metric.names]
            return f"histogram_quantile({_number(self.quantile)}, {_or(parts)})"
        if self.kind is Kind.GAUGE:
            by = ", ".join(groups)
            parts = [
                f"{self.combine} by ({by}) (avg_over_time({name}{sel}[{rng}]))" for name in self.metric.names
            ]
            return _or(parts)
        if self.kind is Kind.RATE:
            return _sum_rate(self.metric, rng, groups, sel)
        if self.kind is Kind.CHAIN:
            chain = self.chain_promql(window, group_by, match, keep_intrinsic)
            return f"{chain['successes']} / (({chain['trials']}) > 0)"
        if self.kind is Kind.POSITIONS:
            # Positions per engine of each server, then the most any engine of the group has.
            inner = ", ".join(_unique(["instance", "engine", *groups]))
            by = ", ".join(groups)
            parts = [f"max by ({by}) (count by ({inner}) ({name}{sel}))" for name in self.metric.names]
            return _or(parts)
        raise ValueError(f"{self.name} is derived from {', '.join(self.inputs)}: it is not one PromQL query")

    def chain_promql(
        self,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> dict[str, str]:
        """The PromQL of a CHAIN signal's parts, per second: ``successes`` (S: accepted tokens),
        ``trials`` (S + F, F = drafts - drafts accepted whole), ``draft_tokens`` and
        ``expected_tokens`` (drafts x k, engine by engine: equal unless drafts are shorter than k).

        The drafts accepted whole are the last position's count, and so the smallest: vLLM counts
        position i only when 0..i were all accepted, so the counts fall with the position and
        ``min without (position)`` is the last one, whatever k is.
        """
        assert self.kind is Kind.CHAIN and self.denominator is not None
        assert self.per_position is not None and self.draft_tokens is not None
        rng = format_duration(window)
        groups = self.groups(group_by, keep_intrinsic)
        sel = _without(match, "position")
        successes = _sum_rate(self.metric, rng, groups, sel)
        drafts = _sum_rate(self.denominator, rng, groups, sel)
        by = ", ".join(groups)
        full = _or(
            [
                f"sum by ({by}) (min without (position) (rate({n}{sel}[{rng}])))"
                for n in self.per_position.names
            ]
        )
        expected = _or(
            [
                f"sum by ({by}) (rate({d}{sel}[{rng}]) * count without (position) ({n}{sel}))"
                for d in self.denominator.names
                for n in self.per_position.names
            ]
        )
        return {
            "successes": successes,
            "trials": f"{successes} + {drafts} - {full}",
            "draft_tokens": _sum_rate(self.draft_tokens, rng, groups, sel),
            "expected_tokens": expected,
        }


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _number(value: float) -> str:
    return repr(float(value)).removesuffix(".0") if value == int(value) else repr(value)


def _or(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def _sum_rate(metric: Metric, rng: str, groups: Sequence[str], selector: str = "") -> str:
    by = ", ".join(groups)
    return _or([f"sum by ({by}) (rate({name}{selector}[{rng}]))" for name in metric.names])


def _without(match: Sequence[Matcher], label: str) -> str:
    """The selector of ``match`` minus the matchers on ``label`` (which the metric lacks)."""
    kept = [m.promql() for m in match if m.label != label]
    return "{" + ", ".join(kept) + "}" if kept else ""
