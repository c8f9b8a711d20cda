"""What the fleet benchmark looks at after its timed rounds, to say where a round's time goes: the
same queries one after another against all at once, and a profile of the event loop's thread."""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from specguard.sources.prometheus import PrometheusSource


async def one_by_one_or_together(
    source: PrometheusSource, exprs: Sequence[str], at: float, repeat: int = 3
) -> dict[str, list[float]]:
    """Seconds for ``exprs`` evaluated at ``at`` one after another (as a round asks them), and all
    at once; alternating, ``repeat`` times each."""
    out: dict[str, list[float]] = {"one_by_one": [], "together": []}
    for _ in range(repeat):
        started = time.perf_counter()
        for expr in exprs:
            await source.query_expr(expr, at)
        out["one_by_one"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.gather(*(source.query_expr(expr, at) for expr in exprs))
        out["together"].append(time.perf_counter() - started)
    return out


async def profile(step: Callable[[], Awaitable[None]], times: int, top: int = 14) -> list[dict[str, Any]]:
    """The functions the event loop's thread spent most time in (their own time) over ``times``
    calls of ``step``: name, calls and seconds per call of ``step``."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(times):
        await step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows: list[dict[str, Any]] = []
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, _cumulative, _) in raw.items():
        where = file.rsplit("/specguard/", 1)[-1] if "/specguard/" in file else file.rsplit("/", 1)[-1]
        rows.append({"function": f"{where}:{line}({name})", "calls": calls / times, "seconds": own / times})
    rows.sort(key=lambda row: -float(row["seconds"]))
    return rows[:top]
