"""A detector's warm-up: the windows it holds until it calibrates, the homogeneity check they must
pass first (``common.homogeneity``), and what it says when they do not.

The warm-up holds each window's counts (its time, S and N). When it has the rule's ``warmup`` of
windows it is checked: one level of traffic calibrates the detector (α0 and φ as before); a shift
does not, and the warm-up slides on instead: the windows before the shift are dropped (at least the
oldest one), new windows come in, and the check runs again once there are enough. A warm-up thus
calibrates at the first moment its last ``warmup`` of windows hold one level, and a collapse inside
it is never learned as normal.

The counts are kept in the store with the rest of the detector's state, so a restart goes on with
the same windows; they are let go once the detector calibrates.
"""

from __future__ import annotations

import base64
import math
import sys
import time
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from specguard.common.homogeneity import Homogeneity, Shift, Window, check, weighted_median
from specguard.common.sequential import Dispersion
from specguard.rules.durations import format_duration
from specguard.rules.schema import Detect


@dataclass
class Held:
    """The warm-up's windows, oldest first: ``(seconds after origin, S, N)`` each (the origin is the
    first window's time until they are all let go).

    Packed: three doubles a window in one ``array('d')``, and stored as their bytes in base64 (a
    detector's hour of 5 s windows is 720 of them, read and written again at every evaluation: as
    lists of numbers that cost 200 bytes a window in memory and most of a round's time at 1,000
    servers, benchmarks/results/fleet_prometheus.md). A state written as lists is still read."""

    origin: float | None = None
    packed: array[float] = field(default_factory=lambda: array("d"))  # t, S, N of each window in turn

    def __len__(self) -> int:
        return len(self.packed) // 3

    @property
    def windows(self) -> list[tuple[float, float, float]]:
        """The windows as ``(seconds after origin, S, N)``."""
        p = self.packed
        return [(p[i], p[i + 1], p[i + 2]) for i in range(0, len(p), 3)]

    def add(self, at: float, successes: float, trials: float) -> None:
        if self.origin is None:
            self.origin = at
        self.packed.extend((round(at - self.origin, 3), round(successes, 3), round(trials, 3)))

    def time_of(self, index: int) -> float:
        return (self.origin or 0.0) + float(self.packed[3 * index])

    def drop(self, count: int) -> None:
        """Let the oldest ``count`` windows go."""
        del self.packed[: 3 * count]
        if not self.packed:
            self.origin = None

    def series(self, interval: float) -> list[Window]:
        """The windows, each marked as following the one before when it came within 1.5 intervals
        (as the detector pairs neighbours for the autocorrelation)."""
        p = self.packed
        out: list[Window] = []
        for i in range(0, len(p), 3):
            follows = i > 0 and p[i] - p[i - 3] <= 1.5 * interval
            out.append(Window(p[i + 1], p[i + 2], follows))
        return out

    def to_json(self) -> dict[str, Any]:
        data = self.packed if sys.byteorder == "little" else _swapped(self.packed)
        return {"origin": self.origin, "packed": base64.b64encode(data.tobytes()).decode("ascii")}

    @classmethod
    def from_json(cls, raw: Any) -> Held:
        """Read at every window, so it is kept short: anything malformed is let go whole."""
        if not isinstance(raw, Mapping):
            return cls()
        origin, packed = raw.get("origin"), array("d")
        try:
            if isinstance(raw.get("packed"), str):
                packed.frombytes(base64.b64decode(raw["packed"], validate=True))
                if sys.byteorder != "little":
                    packed.byteswap()
            else:  # as an older specguard wrote it: [[t, S, N], ...]
                packed.extend(float(v) for t, s, n in raw.get("windows") or () for v in (t, s, n))
        except (TypeError, ValueError):  # (binascii.Error is a ValueError; so is a length not of doubles)
            packed = array("d")
        if len(packed) % 3 or not all(map(math.isfinite, packed)):
            packed = array("d")
        return cls(float(origin) if isinstance(origin, int | float) and packed else None, packed)


def _swapped(packed: array[float]) -> array[float]:
    out = array("d", packed)
    out.byteswap()
    return out


@dataclass
class Unsettled:
    """The last checks that found a shift in the warm-up, since the first of them."""

    since: float  # when the first check found one
    checks: int  # how many found one since
    reason: str  # what the last one found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> Unsettled | None:
        if not isinstance(raw, Mapping):
            return None
        since, checks, reason = raw.get("since"), raw.get("checks"), raw.get("reason")
        if not isinstance(since, int | float) or not isinstance(checks, int) or not isinstance(reason, str):
            return None
        return cls(float(since), checks, reason)

    def status(self) -> str:
        """``since 2026-12-04 12:01:00 UTC (37 checks): ...``"""
        checks = f"{self.checks} check{'s' if self.checks != 1 else ''}"
        return f"since {clock(self.since)} ({checks}): {self.reason}"


def dispersion_of(windows: list[Window]) -> Dispersion:
    """The detector's sums over ``windows``, as if they had come one by one."""
    sums = Dispersion()
    for w in windows:
        sums.add(w.successes, w.trials, w.follows)
    return sums


def drops_of(detect: Detect, center: float) -> list[float]:
    """The falls the rule detects from ``center``: its ``drop``, or ``center`` − each ``shift_to``
    below it."""
    return [d for d in (center - a for a in detect.shifted(center)) if d > 0]


def examine(detect: Detect, windows: list[Window]) -> Homogeneity | None:
    """The homogeneity check of the warm-up's windows (None: the rule's levels are not below their
    median, so there is nothing to check them against; the judging says so)."""
    center = weighted_median([w.alpha for w in windows], [w.trials for w in windows])
    drops = drops_of(detect, center)
    if not drops:
        return None
    return check(windows, drops)


def shift_reason(result: Homogeneity, held: Held, windows: list[Window], interval: float) -> str:
    """What a check that found a shift says: where, at what level against the rest, how many of its
    windows lie past the level it was checked for."""
    shift = result.shift
    assert shift is not None
    begin, end = held.time_of(shift.begin), held.time_of(shift.end)
    stretch = windows[shift.begin : shift.end + 1]
    if shift.below:
        past, bound = sum(w.alpha < shift.level for w in stretch), f"under {shift.level:.3f} (the median less"
    else:
        past, bound = sum(w.alpha > shift.level for w in stretch), f"over {shift.level:.3f} (the median plus"
    return (
        f"from {clock(begin - interval)} for {format_duration(end - begin + interval)} its windows had "
        f"acceptance {shift.alpha:.3f} against the warm-up's median {result.center:.3f}, {past} of their "
        f"{len(stretch)} {bound} {shift.drop:g}): a shift by the CUSUM ({shift.evidence:.1f} over h "
        f"{result.threshold:.1f}), so the warm-up goes on without the windows before them"
    )


def slide_past(held: Held, windows: list[Window], shift: Shift) -> Dispersion:
    """Drop the windows older than the shift (at least the oldest): the warm-up goes on from there.
    The sums of the windows left."""
    count = max(1, shift.begin)
    held.drop(count)
    return dispersion_of(windows[count:])


def clock(at: float) -> str:
    if not math.isfinite(at):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
