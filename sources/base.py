"""What every source returns, and the interface the runtime calls."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specguard.rules.matchers import Matcher
from specguard.rules.signals import Kind, Signal


@dataclass(frozen=True)
class Series:
    """One value of a signal for one label set. ``value`` is never NaN (NaN means no data).

    ``trials``: for the chain model's acceptance, the trials behind the value over the window
    (S + F), so that a sequential test can weigh the window by its evidence.
    """

    labels: Mapping[str, str]
    value: float
    trials: float | None = None


# Drafts shorter than k by more than this share make the chain model's estimate biased.
SHORT_DRAFTS_TOLERANCE = 0.01


@dataclass(frozen=True)
class ChainCounts:
    """One group's counts over a window (or per-second rates: the scale cancels in every ratio)."""

    labels: Mapping[str, str]
    successes: float  # accepted tokens
    trials: float  # accepted tokens + drafts that ended in a rejection
    draft_tokens: float
    expected_tokens: float  # drafts x k, engine by engine


def chain_result(
    signal: Signal, counts: Sequence[ChainCounts], scale: float, warming: frozenset[str] = frozenset()
) -> SourceResult:
    """token_acceptance from each group's counts; ``scale`` turns them into counts over the window
    (the window's length for per-second rates, 1 for counts). A group without trials has no data;
    one whose drafts are shorter than k is an error, with the reason: its estimate would be biased
    (an ngram proposer drafts fewer tokens when the prompt has no long match)."""
    good: list[Series] = []
    bad: list[Invalid] = []
    for group in counts:
        if group.trials <= 0:
            continue
        if group.draft_tokens < (1 - SHORT_DRAFTS_TOLERANCE) * group.expected_tokens:
            short = 1 - group.draft_tokens / group.expected_tokens
            bad.append(
                Invalid(
                    dict(group.labels),
                    f"{signal.name} is biased here: drafts carry {short:.0%} fewer tokens than k "
                    "(an ngram or suffix proposer drafts less when the prompt has no long match), "
                    "so a draft cut short reads as a rejection; use acceptance_rate for this server",
                )
            )
            continue
        value = group.successes / group.trials
        reason = signal.out_of_domain(value)
        if reason is not None:
            bad.append(Invalid(dict(group.labels), reason))
        else:
            good.append(Series(dict(group.labels), value, group.trials * scale))
    return SourceResult(series=tuple(good), invalid=tuple(bad), warming=warming)


@dataclass(frozen=True)
class Invalid:
    """A series whose value cannot be true (outside the signal's domain): an error, never a breach."""

    labels: Mapping[str, str]
    reason: str


@dataclass(frozen=True)
class SourceResult:
    """The answer to one query.

    ``error`` set: the query failed (an *error*, never a breach by itself).
    ``series`` empty and no error: the query worked and there is *no data*.
    ``invalid``: series whose values are impossible (negative counts, ratios above 1, NaN...).
    ``warming``: ``instance`` labels of targets that have not got enough samples yet to answer;
    a series from one of them, or one that aggregates over targets, is *warming up*.
    """

    series: tuple[Series, ...] = ()
    error: str | None = None
    detail: Mapping[str, str] = field(default_factory=dict)
    invalid: tuple[Invalid, ...] = ()
    warming: frozenset[str] = frozenset()

    @classmethod
    def failed(cls, message: str) -> SourceResult:
        return cls(error=message)

    @classmethod
    def of(cls, items: Sequence[tuple[Mapping[str, str], float]]) -> SourceResult:
        """Build a result, dropping NaN and infinite values (no data for that series)."""
        return cls(
            series=tuple(
                Series(dict(labels), float(value)) for labels, value in items if math.isfinite(value)
            )
        )

    @classmethod
    def checked(
        cls,
        signal: Signal,
        items: Sequence[tuple[Mapping[str, str], float]],
        warming: frozenset[str] = frozenset(),
    ) -> SourceResult:
        """Build a result for ``signal``, keeping values outside its domain apart as invalid.

        A quantile of a histogram with no observations in the window is NaN in Prometheus: that is
        no data. Any other NaN or infinity is a value no vLLM can have produced.
        """
        good: list[Series] = []
        bad: list[Invalid] = []
        for labels, value in items:
            if math.isnan(value) and signal.kind is Kind.QUANTILE:
                continue
            reason = signal.out_of_domain(float(value))
            if reason is None:
                good.append(Series(dict(labels), float(value)))
            else:
                bad.append(Invalid(dict(labels), reason))
        return cls(series=tuple(good), invalid=tuple(bad), warming=warming)

    def is_warming(self, labels: Mapping[str, str]) -> bool:
        """Whether a series with ``labels`` comes from (or sums over) a target still warming up."""
        if not self.warming:
            return False
        instance = labels.get("instance")
        return instance is None or instance in self.warming


class Source(Protocol):
    """A place signals come from. Implementations never raise for a failed query: they say so.

    A source whose answers come over the network sets ``reads_ahead = True``: the daemon's round
    then asks for all its rules' readings at once, and judges each as its answer comes."""

    kind: str  # "scrape" or "prometheus"

    async def refresh(self) -> None:
        """Take whatever fresh sample the source needs before a round of queries."""

    async def query_signal(
        self,
        signal: Signal,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> SourceResult:
        """``signal`` over ``window`` seconds, one series per ``group_by`` label set (plus the
        signal's intrinsic labels, such as ``position``, unless ``keep_intrinsic`` is false), from
        the raw series that ``match`` selects."""
        ...

    async def query_expr(self, expr: str) -> SourceResult:
        """Raw PromQL. Only the Prometheus source supports it."""
        ...

    async def close(self) -> None: ...
