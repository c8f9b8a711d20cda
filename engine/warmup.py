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
import struct
import sys
import time
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from specguard.common.homogeneity import Homogeneity, Shift, Window, check, weighted_median
from specguard.common.sequential import Dispersion
from specguard.rules.durations import format_duration
from specguard.rules.schema import Detect

# One window as the store keeps it: t (seconds after the origin), S and N, little-endian doubles.
_WINDOW = struct.Struct("<3d")


@dataclass
class Held:
    """The warm-up's windows, oldest first: ``(seconds after origin, S, N)`` each (the origin is the
    first window's time until they are all let go).

    Packed: three little-endian doubles a window, in one ``bytes``, which the store keeps as they are
    in a column of their own (``series_state.held``). A detector's hour of 5 s windows is 720 of
    them, and a window is added at every evaluation: they are decoded only when the warm-up is
    checked, and an evaluation adds its window by one copy of the bytes, never decoding, encoding or
    writing them into JSON (as lists of numbers, then as base64 in the state's JSON, they took most
    of a round's time and memory at 1,000 servers: benchmarks/results/fleet_prometheus.md). A state
    an older specguard wrote, with the windows in its JSON as base64 or as lists, is still read."""

    origin: float | None = None
    packed: bytes = b""  # t, S, N of each window in turn

    def __len__(self) -> int:
        return len(self.packed) // _WINDOW.size

    def _values(self) -> array[float]:
        values = array("d")
        values.frombytes(self.packed)
        if sys.byteorder != "little":
            values.byteswap()
        return values

    @property
    def windows(self) -> list[tuple[float, float, float]]:
        """The windows as ``(seconds after origin, S, N)``."""
        p = self._values()
        return [(p[i], p[i + 1], p[i + 2]) for i in range(0, len(p), 3)]

    def add(self, at: float, successes: float, trials: float) -> None:
        if self.origin is None:
            self.origin = at
        self.packed += _WINDOW.pack(round(at - self.origin, 3), round(successes, 3), round(trials, 3))

    def time_of(self, index: int) -> float:
        offset: float = _WINDOW.unpack_from(self.packed, _WINDOW.size * index)[0]
        return (self.origin or 0.0) + offset

    def drop(self, count: int) -> None:
        """Let the oldest ``count`` windows go."""
        self.packed = self.packed[_WINDOW.size * count :]
        if not self.packed:
            self.origin = None

    def series(self, interval: float) -> list[Window] | None:
        """The windows, each marked as following the one before when it came within 1.5 intervals
        (as the detector pairs neighbours for the autocorrelation); None when a number is not finite
        (checked here, where they are decoded, not at each read)."""
        p = self._values()
        if not all(map(math.isfinite, p)):
            return None
        out: list[Window] = []
        for i in range(0, len(p), 3):
            follows = i > 0 and p[i] - p[i - 3] <= 1.5 * interval
            out.append(Window(p[i + 1], p[i + 2], follows))
        return out

    def to_json(self) -> dict[str, Any]:
        """The origin, and the windows as bytes: the store writes them to their own column, the
        rest of the state as JSON (``store.commits``)."""
        return {"origin": self.origin, "packed": self.packed}

    @classmethod
    def from_json(cls, raw: Any) -> Held:
        """Read at every window, so it is kept short (the numbers are checked when they are decoded
        for the check): anything malformed is let go whole."""
        if not isinstance(raw, Mapping):
            return cls()
        origin, given = raw.get("origin"), raw.get("packed")
        packed = b""
        try:
            if isinstance(given, bytes):  # as the store gives them back
                packed = given
            elif isinstance(given, str):  # base64 in the JSON, as an older specguard wrote it
                packed = base64.b64decode(given, validate=True)
            else:  # older still: [[t, S, N], ...]
                values = [float(v) for t, s, n in raw.get("windows") or () for v in (t, s, n)]
                if not all(map(math.isfinite, values)):
                    return cls()
                packed = b"".join(_WINDOW.pack(*values[i : i + 3]) for i in range(0, len(values), 3))
        except (TypeError, ValueError):  # (binascii.Error is a ValueError)
            return cls()
        if len(packed) % _WINDOW.size:
            return cls()
        return cls(float(origin) if isinstance(origin, int | float) and packed else None, packed)


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
    return Dispersion.of((w.successes, w.trials, w.follows) for w in windows)


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
