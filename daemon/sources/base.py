"""What every source returns, and the interface the runtime calls."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from daemon.signals import Signal


@dataclass(frozen=True)
class Series:
    """One value of a signal for one label set. ``value`` is never NaN (NaN means no data)."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class SourceResult:
    """The answer to one query.

    ``error`` set: the query failed (an *error*, never a breach by itself).
    ``series`` empty and no error: the query worked and there is *no data*.
    """

    series: tuple[Series, ...] = ()
    error: str | None = None
    detail: Mapping[str, str] = field(default_factory=dict)

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


class Source(Protocol):
    """A place signals come from. Implementations never raise for a failed query: they say so."""

    kind: str  # "scrape" or "prometheus"

    async def refresh(self) -> None:
        """Take whatever fresh sample the source needs before a round of queries."""

    async def query_signal(self, signal: Signal, window: float, group_by: Sequence[str]) -> SourceResult: ...

    async def query_expr(self, expr: str) -> SourceResult:
        """Raw PromQL. Only the Prometheus source supports it."""
        ...

    async def close(self) -> None: ...
