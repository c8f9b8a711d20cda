"""An asyncio event loop on simulated time, for code that waits with ``asyncio.sleep`` and reads
``loop.time()`` (the simulator's engine): when every task is waiting, the loop moves its clock to
the next timer at once instead of sleeping, so ten simulated minutes take a few seconds of work
and come out the same on a loaded machine. Only for code that does no real I/O: a socket would
wait in real time while the clock jumps."""

from __future__ import annotations

import asyncio
import selectors
import types
from typing import Any


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop_clock: list[float]) -> None:
        super().__init__()
        self._clock = loop_clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("simulated time: every task waits, and no timer can wake one")
        self._clock[0] += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``time()`` is simulated seconds from ``start``; a wait costs no real time."""

    def __init__(self, start: float = 0.0) -> None:
        self._clock = [start]
        super().__init__(_Selector(self._clock))

    def time(self) -> float:
        return self._clock[0]


def clock_module(loop: VirtualTimeLoop, epoch: float) -> Any:
    """A stand-in for the ``time`` module of code under test: ``monotonic()`` is the loop's
    clock, ``time()`` the same plus ``epoch`` (a Unix time)."""
    return types.SimpleNamespace(monotonic=loop.time, time=lambda: epoch + loop.time())
