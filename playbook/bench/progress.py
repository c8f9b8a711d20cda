"""The live progress line of ``specguard bench`` on a terminal: the phase, requests done of the
total, errors, time so far and the time left; and the notes said before the run (on stderr always).

The time left is the rate so far applied to what remains (requests), or the planned measured time
less the time spent (a run for a duration); it is not said until a request has been answered."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from specguard.playbook.bench import client

WIDTH = 79


def duration_text(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short enough for a progress line."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class ProgressLine:
    """One line on a terminal (``show``), rewritten as answers come in. It keeps the results too,
    for a run cut short by Ctrl-C."""

    def __init__(self, out: TextIO, show: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.show = show
        self.clock = clock
        self.results: dict[str, list[client.Result]] = {}
        self.first: dict[str, float] = {}
        self.shown = False
        self.started = clock()
        self.total: int | None = None  # measured requests planned, every server together
        self.seconds: float | None = None  # or the measured time planned (a run for a duration)
        self.done = 0
        self.errors = 0

    def planned(self, requests: int | None, seconds: float | None) -> None:
        self.total, self.seconds = requests, seconds
        self.started = self.clock()

    def note(self, line: str) -> None:
        self.clear()
        self.out.write(f"specguard bench: {line}\n")
        self.out.flush()

    def update(self, klass: str, result: client.Result) -> None:
        self.results.setdefault(klass, []).append(result)
        self.first.setdefault(klass, result.started)
        self.done += 1
        self.errors += not result.ok
        if not self.show:
            return
        self.out.write("\r" + self.text(klass).ljust(WIDTH)[:WIDTH])
        self.out.flush()
        self.shown = True

    def text(self, klass: str) -> str:
        elapsed = self.clock() - self.started
        done = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        line = f"[{klass}] {done} requests, {self.errors} errors, {duration_text(elapsed)}"
        left = self.left(elapsed)
        return line + (f", ETA {duration_text(left)}" if left is not None else "")

    def left(self, elapsed: float) -> float | None:
        """Seconds to go, or None when they cannot be told yet."""
        if self.total is not None:
            if self.done == 0:
                return None
            return elapsed / self.done * max(self.total - self.done, 0)
        if self.seconds is not None:
            return max(self.seconds - elapsed, 0.0)
        return None

    def elapsed(self, klass: str) -> float:
        return max(1e-9, time.perf_counter() - self.first.get(klass, time.perf_counter()))

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r" + " " * WIDTH + "\r")
            self.out.flush()
            self.shown = False
