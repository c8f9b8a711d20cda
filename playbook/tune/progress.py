"""``specguard tune``'s progress on stderr: one line per restart and per measurement, with the time
so far and the time left. A restart's time is the mean of those made so far (before the first, the
estimate given); a measurement's, the mean of those done (before the first, unknown)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from specguard.playbook.bench.progress import duration_text


class TuneProgress:
    def __init__(
        self,
        out: TextIO,
        restarts: int,
        measurements: int,
        restart_guess: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.clock = out, clock
        self.restarts_left, self.measurements_left = restarts, measurements
        self.restart_guess = restart_guess
        self.restart_times: list[float] = []
        self.measure_times: list[float] = []
        self.started = clock()
        self.count = 0
        self.total = restarts + measurements

    def left(self) -> float | None:
        """Seconds to go, None while a measurement's time is not known."""
        if self.measurements_left and not self.measure_times:
            return None
        restart = (
            sum(self.restart_times) / len(self.restart_times) if self.restart_times else self.restart_guess
        )
        measure = sum(self.measure_times) / len(self.measure_times) if self.measure_times else 0.0
        return self.restarts_left * restart + self.measurements_left * measure

    def say(self, what: str) -> None:
        self.count += 1
        elapsed = duration_text(self.clock() - self.started)
        left = self.left()
        eta = f", ETA {duration_text(left)}" if left is not None else ""
        self.out.write(f"specguard tune: [{self.count}/{self.total}] {what} ({elapsed} so far{eta})\n")
        self.out.flush()

    def note(self, line: str) -> None:
        self.out.write(f"specguard tune: {line}\n")
        self.out.flush()

    def restarted(self, seconds: float) -> None:
        self.restart_times.append(seconds)
        self.restarts_left = max(0, self.restarts_left - 1)

    def measured(self, seconds: float) -> None:
        self.measure_times.append(seconds)
        self.measurements_left = max(0, self.measurements_left - 1)
