"""The Prometheus source of a backtest: the daemon's own queries, evaluated over the period at once.

A range query is by definition the instant query evaluated at every step of its range, so each of
the daemon's queries (a signal's PromQL, each part of token_acceptance, a rule's raw PromQL) is asked
once per rule as a range over the period with the rule's interval as its step, in chunks of at most
``MOST_POINTS`` steps, and each moment of the replay is answered from it, exactly as the daemon's
instant query at that moment would have been. A moment off the grid is asked as an instant query.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from specguard.backtest.judge import moments
from specguard.backtest.plan import Plan
from specguard.sources.base import SourceResult
from specguard.sources.prometheus import _QUERY_ERRORS, PrometheusSource, _float

MOST_POINTS = 10_000  # Prometheus refuses a range of more than 11,000 points per series

Answer = list[tuple[Mapping[str, str], float]]


class RangeSource(PrometheusSource):
    """``PrometheusSource`` whose instant queries are answered from range queries (see the module)."""

    def __init__(
        self, url: str, timeout: float, bearer_token: str | None = None, verify_tls: bool = True
    ) -> None:
        self._now: Callable[[], float] = lambda: 0.0
        super().__init__(
            url, timeout, bearer_token=bearer_token, verify_tls=verify_tls, clock=lambda: self._now()
        )
        self.step = 60.0
        self.start = 0.0
        self.end = 0.0
        self._ranges: dict[tuple[str, float], dict[int, Answer] | SourceResult] = {}
        self.queries = 0  # range queries asked

    def bind(self, now: Callable[[], float], plans: Sequence[Plan], start: float, end: float) -> None:
        """The replay's clock and period."""
        self._now = now
        self.start, self.end = start, end

    async def _query(self, expr: str, at: float | None = None) -> SourceResult | Answer:
        at = self._now() if at is None else at
        key = (expr, self.step)
        if key not in self._ranges:
            self._ranges[key] = await self._range(expr)
        got = self._ranges[key]
        if isinstance(got, SourceResult):
            return got
        answer = got.get(round(at * 1000))
        if answer is not None:
            return answer
        if moments(at, at, self.step) == [at] and self.start <= at <= self.end:
            return []  # on the grid, and Prometheus had nothing there: no data
        return await super()._query(expr, at)

    async def _range(self, expr: str) -> dict[int, Answer] | SourceResult:
        """Every step's answer over the period, keyed by the moment in milliseconds."""
        grid = moments(self.start, self.end, self.step)
        out: dict[int, Answer] = {}
        for first in range(0, len(grid), MOST_POINTS):
            chunk = grid[first : first + MOST_POINTS]
            self.queries += 1
            try:
                result = await asyncio.to_thread(
                    self._client.custom_query_range,
                    expr,
                    datetime.fromtimestamp(chunk[0], UTC),
                    datetime.fromtimestamp(chunk[-1], UTC),
                    _step(self.step),
                    params=dict(self._params),
                )
            except _QUERY_ERRORS as exc:
                return self._failed(self._describe(exc))
            parsed = _matrix(result)
            if isinstance(parsed, str):
                return self._failed(parsed)
            for at, items in parsed.items():
                out.setdefault(at, []).extend(items)
        return out


def _step(seconds: float) -> str:
    return str(int(seconds)) if seconds == int(seconds) else repr(seconds)


def _matrix(result: Any) -> dict[int, Answer] | str:
    """``{"metric": {...}, "values": [[t, "v"], ...]}`` items as each moment's (labels, value)."""
    if not isinstance(result, list):
        return f"unexpected answer: result is {type(result).__name__}"
    out: dict[int, Answer] = {}
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        labels = item.get("metric", {}) if isinstance(item, dict) else None
        if not isinstance(values, list) or not isinstance(labels, dict):
            return f"unexpected answer: {item!r}"[:200]
        named = {str(k): str(v) for k, v in labels.items()}
        for pair in values:
            value = _float(pair[1]) if isinstance(pair, list) and len(pair) == 2 else None
            if value is None or not isinstance(pair[0], int | float):
                return f"unexpected answer: {pair!r}"[:200]
            out.setdefault(round(float(pair[0]) * 1000), []).append((named, value))
    return out
