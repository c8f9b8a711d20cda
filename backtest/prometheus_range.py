"""The Prometheus source of a backtest: the daemon's own queries, evaluated over the period at once.

A range query is by definition the instant query evaluated at every step of its range, so each of
the daemon's queries (a signal's PromQL, each part of token_acceptance, a rule's raw PromQL) is asked
once per rule as a range over the period with the rule's interval as its step, in chunks of at most
``MOST_POINTS`` steps, and each moment of the replay is answered from it, exactly as the daemon's
instant query at that moment would have been.

The grid is the replay's (``judge.moments``: multiples of the interval from the epoch), kept to the
millisecond, Prometheus's own resolution: the range is asked with that start, end and step exactly
(the client library would round them to whole seconds, and a grid off by half a second answers no
moment). The step is ``step`` (``run.py`` sets it to each rule's interval in turn); a moment off its
grid, as when a rule is replayed again after the others (the calibration), takes the interval of a
rule bound whose grid holds it. A moment on no grid, or outside the period, is asked as an instant
query; so is an expression with ``@ start()`` or ``@ end()``, which a range query reads as the
range's bounds where an instant query reads its own moment.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from specguard.backtest.judge import moments
from specguard.backtest.plan import Plan
from specguard.sources.base import SourceResult
from specguard.sources.prometheus import _QUERY_ERRORS, PrometheusSource, _float

# Prometheus refuses a range of more than 11,000 steps ((end - start) / step > 11,000): 11,000
# points are 10,999 steps, and a week at one minute (10,080) is one range.
MOST_POINTS = 11_000

# ``@ start()`` and ``@ end()``: the range's bounds in a range query, the moment in an instant one.
_RANGE_BOUNDS = re.compile(r"@\s*(?:start|end)\s*\(\s*\)")

Answer = list[tuple[Mapping[str, str], float]]
Range = dict[int, Answer] | SourceResult  # each moment's answer, keyed in milliseconds; or the failure


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
        self._steps: tuple[float, ...] = ()  # the bound rules' intervals, the longest first
        self._ranges: dict[str, dict[int, Range]] = {}  # expr -> step in ms -> its range
        self.queries = 0  # range queries asked

    def bind(self, now: Callable[[], float], plans: Sequence[Plan], start: float, end: float) -> None:
        """The replay's clock, the rules it replays, and its period [start, end)."""
        self._now = now
        if (start, end) != (self.start, self.end):
            self._ranges.clear()  # ranges over another period answer none of this one's moments
        self.start, self.end = start, end
        self._steps = tuple(sorted({p.every for p in plans}, reverse=True))

    async def _query(self, expr: str, at: float | None = None) -> SourceResult | Answer:
        at = self._now() if at is None else at
        if _RANGE_BOUNDS.search(expr):
            return await super()._query(expr, at)
        moment = _ms(at)
        ranges = self._ranges.setdefault(expr, {})
        for asked, got in ranges.items():
            if self._on_grid(moment, asked):
                return got if isinstance(got, SourceResult) else got.get(moment, [])
        step = next((_ms(s) for s in (self.step, *self._steps) if self._on_grid(moment, _ms(s))), None)
        if step is None:
            return await super()._query(expr, at)
        got = ranges[step] = await self._range(expr, step)
        # On the grid, and Prometheus had nothing there: no data, as the instant query would say.
        return got if isinstance(got, SourceResult) else got.get(moment, [])

    def _on_grid(self, moment: int, step: int) -> bool:
        """Is ``moment`` (ms) one of the period's moments of the interval ``step`` (ms)?"""
        return step > 0 and moment % step == 0 and _ms(self.start) <= moment < _ms(self.end)

    def _grid(self, step: int) -> list[int]:
        """The period's moments of the interval ``step``, in milliseconds."""
        seconds = step / 1000
        return sorted({_ms(m) for m in moments(self.start, self.end, seconds) if self._on_grid(_ms(m), step)})

    async def _range(self, expr: str, step: int) -> Range:
        """Every moment's answer over the period, the moment in milliseconds."""
        grid = self._grid(step)
        out: dict[int, Answer] = {}
        for first in range(0, len(grid), MOST_POINTS):
            chunk = grid[first : first + MOST_POINTS]
            self.queries += 1
            # Exact bounds and step as parameters: they override the client's, rounded to seconds.
            bounds = {"start": _seconds(chunk[0]), "end": _seconds(chunk[-1]), "step": _seconds(step)}
            params = {**self._params, **bounds}
            try:
                result = await asyncio.to_thread(
                    self._client.custom_query_range,
                    expr,
                    datetime.fromtimestamp(chunk[0] / 1000, UTC),
                    datetime.fromtimestamp(chunk[-1] / 1000, UTC),
                    _seconds(step),
                    params=params,
                )
            except _QUERY_ERRORS as exc:
                return self._failed(self._describe(exc))
            parsed = _matrix(result)
            if isinstance(parsed, str):
                return self._failed(parsed)
            for at, items in parsed.items():
                out.setdefault(at, []).extend(items)
        return out


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _seconds(ms: int) -> str:
    """Milliseconds as Prometheus reads a time or a duration: seconds, to the millisecond."""
    whole, part = divmod(ms, 1000)
    return f"{whole}.{part:03d}" if part else str(whole)


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
            if value is None or isinstance(pair[0], bool) or not isinstance(pair[0], int | float):
                return f"unexpected answer: {pair!r}"[:200]
            out.setdefault(_ms(float(pair[0])), []).append((named, value))
    return out
