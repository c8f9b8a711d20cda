"""The first phase on several cores: each rule judged in a worker process, from history.

Rules are judged independently of one another (the second phase, which orders their events, runs
in the parent), so a week of the shipped pack spreads over the host's cores, the costliest rule
first (a detector's evaluation costs several threshold rules'), each worker taking the next rule
when it is done. The workers are forked from a parent with a single thread: they share the history
it loaded (copy on write) and start at once. A parent with other threads (a second run of
``--compare``: the first left the event loop's pool of threads behind) spawns them instead, since a
fork copies only the forking thread, and each loads the history itself. A worker judges without an
event loop (``settled``): the history source never waits, and a forked child must not touch the
loop it inherited. A period of a few hours is judged in the parent: workers would cost more than
they save.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from specguard.backtest.judge import Judged, judge
from specguard.backtest.plan import Plan
from specguard.sources.history import HistorySource, Wanted
from specguard.sources.history import load as load_history
from specguard.store.baseline import Baseline
from specguard.store.connection import read_only

# Below this many evaluations in all, the rules are judged in the parent.
WORTH_A_WORKER = 20_000

T = TypeVar("T")


def jobs_for(plans: Sequence[Plan], start: float, end: float, asked: int | None = None) -> int:
    """How many workers judge ``plans``: ``asked``, else one per core (at most one per rule); 1 when
    the work is too small to share."""
    live = [p for p in plans if p.skip is None]
    cores = asked if asked is not None else len(os.sched_getaffinity(0))
    evaluations = sum((end - start) / p.every for p in live)
    if len(live) < 2 or evaluations < WORTH_A_WORKER:
        return 1
    return max(1, min(cores, len(live)))


def cost(plan: Plan) -> float:
    """What judging ``plan`` costs, roughly: evaluations, a detector's four times a threshold's."""
    return (4.0 if plan.item.rule.detect is not None else 1.0) / plan.every


def settled(work: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never waits (the judging of history), run without a loop."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    work.close()
    raise RuntimeError("judging from history waited for something: it needs an event loop")


# A worker's history, its clock and the baseline: set before a fork, or by a spawned worker's start.
_SOURCE: HistorySource | None = None
_NOW: list[float] = [0.0]
_BASELINE: Baseline | None = None


def _given(source: HistorySource | None, baseline: Baseline | None) -> None:
    global _SOURCE, _BASELINE
    _SOURCE, _BASELINE = source, baseline


def _load(store: Path, first: float, end: float, wanted: Wanted, baseline: Baseline | None) -> None:
    """A spawned worker's start: the period's history, once."""
    _given(history(store, first, end, wanted), baseline)


def _judge(plan: Plan, start: float, end: float) -> Judged:
    assert _SOURCE is not None

    def set_clock(at: float) -> None:
        _NOW[0] = at

    return settled(judge(plan, _SOURCE, _BASELINE, start, end, set_clock))


def history(
    store: Path, first: float, end: float, wanted: Wanted, clock: Callable[[], float] | None = None
) -> HistorySource:
    """The store's history over [first, end), what ``wanted`` names of it, read at ``clock`` (default:
    the workers' clock). Raises sqlite3.Error."""
    with contextlib.closing(read_only(store)) as db:
        recordings, minutes = load_history(db, first, end, wanted)
    return HistorySource(recordings, first, minutes, clock or (lambda: _NOW[0]))


async def judged_apart(
    plans: Sequence[Plan],
    jobs: int,
    store: Path,
    first: float,
    start: float,
    end: float,
    wanted: Wanted,
    baseline: Baseline | None,
) -> list[Judged]:
    """``plans`` judged by ``jobs`` workers, in the order given."""
    order = sorted(range(len(plans)), key=lambda i: cost(plans[i]), reverse=True)
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        # Loaded on this thread, the loop waiting: a thread of the loop's pool would outlive it and
        # make the next fork unsafe. A one-shot command has nothing else to do meanwhile.
        _given(history(store, first, end, wanted), baseline)
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"))
    else:
        pool = ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_load,
            initargs=(store, first, end, wanted, baseline),
        )  # fmt: skip
    try:
        with pool:
            futures = {i: asyncio.wrap_future(pool.submit(_judge, plans[i], start, end)) for i in order}
            done = {i: await future for i, future in futures.items()}
    finally:
        _given(None, None)
    return [done[i] for i in range(len(plans))]
