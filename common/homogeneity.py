"""Whether a detector's warm-up holds one level of acceptance: the check made before its in-control
acceptance α₀ and dispersion φ are learned from it (a Phase I analysis, in control-chart terms).

A warm-up that holds a collapse teaches the detector that collapses are normal: α₀ falls between the
levels, and φ, which measures how far windows stray from α₀, grows with the square of the gap, so
every later window weighs next to nothing. The check runs the detector's own CUSUM over the
warm-up's windows, in both directions, against estimates that a shift cannot move:

1. **Centre**: m, the median of the windows' α̂ weighted by their trials. A shift that holds fewer
   than half the warm-up's trials cannot move it out of the level of the rest.
2. **Noise**: s, from the median moving range, median |α̂_w − α̂_(w−1)| / 0.954, as an individuals
   chart estimates it. A shift moves only the few differences that straddle its edges, however much
   of the warm-up it holds. Consecutive windows share requests, so this understates the windows'
   own spread (about twofold on simulated traffic): ``NOISE_MULTIPLE`` of it is about four of their
   standard deviations.
3. **Dispersion**: φ, the long-run dispersion (``Dispersion.phi``, as the detector learns it) of the
   windows within max(d, ``NOISE_MULTIPLE`` s) of m alone, d the smallest drop the rule detects:
   windows of another level are left out, so that they cannot inflate the scale they are judged by.
4. **CUSUM**: for each drop d the rule detects, G = max(0, G + Z) over every window with
   Z = [S ln(a/m) + F ln((1−a)/(1−m))] / φ at a = m − d and at a = m + d. The warm-up holds a shift
   when one reaches h = ln(n W / p), n such CUSUMs over W windows: by Ville's inequality a CUSUM of
   likelihood ratios started at any one window reaches h with probability at most e^(−h), so a
   warm-up of one level is taken for two with probability at most p (``FALSE_REJECTION``), were it
   the chain model with dispersion φ. Real traffic is not quite that; the documentation gives the
   rate measured on simulated traffic.

Pure arithmetic, O(W) per level and one sort: cheap enough to run at every window.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from specguard.common.sequential import EDGE, Dispersion

FALSE_REJECTION = 0.01  # p: at most this share of one-level warm-ups is rejected (nominal)
NOISE_MULTIPLE = 8.0  # windows farther than this many times s (the moving range's) from m are left out of φ
MOVING_RANGE = 0.954  # median |X_t − X_(t−1)| of independent unit normals: sqrt(2) 0.6745


@dataclass(frozen=True)
class Window:
    """One warm-up window: S, N = S + F, and whether it came right after the one before."""

    successes: float
    trials: float
    follows: bool = True

    @property
    def alpha(self) -> float:
        return self.successes / self.trials


@dataclass(frozen=True)
class Shift:
    """A stretch of the warm-up at another level: windows ``begin`` to ``end`` (indices, both in),
    where the CUSUM against ``level`` rose from 0 to its peak ``evidence``."""

    begin: int
    end: int
    alpha: float  # α̂ over the stretch
    level: float  # the CUSUM's alternative, m − d or m + d
    drop: float  # d
    below: bool  # the alternative is m − d
    evidence: float


@dataclass(frozen=True)
class Homogeneity:
    """What the check found: the estimates it judged by, and the first shift, if any."""

    center: float
    noise: float  # s, from the moving range
    band: float  # the windows within this of the centre make φ
    phi: float
    threshold: float  # h
    evidence: float  # the largest G of any CUSUM
    shift: Shift | None

    @property
    def homogeneous(self) -> bool:
        return self.shift is None


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value below and above which half the weight lies (the lower one on a tie)."""
    if not values:
        raise ValueError("the median of nothing")
    pairs = sorted(zip(values, weights, strict=True))
    half = sum(weights) / 2
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= half:
            return value
    return pairs[-1][0]


def moving_range_noise(windows: Sequence[Window]) -> float:
    """The standard deviation of a window's α̂ from the median absolute difference of neighbouring windows (0 without
    neighbours)."""
    steps = sorted(abs(w.alpha - before.alpha) for before, w in itertools.pairwise(windows) if w.follows)
    if not steps:
        return 0.0
    middle = len(steps) // 2
    median = steps[middle] if len(steps) % 2 else (steps[middle - 1] + steps[middle]) / 2
    return median / MOVING_RANGE


def check(
    windows: Sequence[Window], drops: Sequence[float], false_rejection: float = FALSE_REJECTION
) -> Homogeneity:
    """Whether ``windows`` hold one level, judged against shifts of ``drops`` (each > 0) either way."""
    if not windows:
        raise ValueError("no windows to check")
    if not drops or min(drops) <= 0:
        raise ValueError(f"the drops to check for are above 0, got {list(drops)}")
    if not 0 < false_rejection < 1:
        raise ValueError(f"a false-rejection rate is in (0, 1), got {false_rejection!r}")
    center = weighted_median([w.alpha for w in windows], [w.trials for w in windows])
    noise = moving_range_noise(windows)
    band = max(min(drops), NOISE_MULTIPLE * noise)

    def near() -> Iterator[tuple[float, float, bool]]:
        previous_in = False
        for w in windows:
            inside = abs(w.alpha - center) <= band
            if inside:
                yield w.successes, w.trials, previous_in and w.follows
            previous_in = inside

    inliers = Dispersion.of(near())
    phi = max(1.0, inliers.phi or 1.0)
    tests = [
        (center + sign * d, d)
        for d in sorted(set(drops))
        for sign in (-1.0, 1.0)
        if EDGE <= center + sign * d <= 1 - EDGE
    ]
    if not tests or not EDGE <= center <= 1 - EDGE:
        # α̂ at 0 or 1 everywhere: no level to tell apart from it (and no likelihood ratio).
        return Homogeneity(center, noise, band, phi, math.inf, 0.0, None)
    h = math.log(len(tests) * len(windows) / false_rejection)
    largest, found = 0.0, None
    for level, drop in tests:
        peak, shift = _cusum(windows, center, level, phi, h)
        largest = max(largest, peak)
        if shift is not None:
            stretch = windows[shift[0] : shift[1] + 1]
            alpha = sum(w.successes for w in stretch) / sum(w.trials for w in stretch)
            candidate = Shift(shift[0], shift[1], alpha, level, drop, level < center, shift[2])
            if found is None or (candidate.begin, -candidate.evidence) < (found.begin, -found.evidence):
                found = candidate
    return Homogeneity(center, noise, band, phi, h, largest, found)


def _cusum(
    windows: Sequence[Window], center: float, level: float, phi: float, h: float
) -> tuple[float, tuple[int, int, float] | None]:
    """The largest G of the CUSUM of ``level`` against ``center``, and the first stretch where it
    reached ``h``: (the window where G left 0, the window of its peak there, that peak)."""
    up = math.log(level / center) / phi
    down = math.log((1 - level) / (1 - center)) / phi
    g, largest, start = 0.0, 0.0, 0
    crossed: tuple[int, int, float] | None = None
    over = False  # the first stretch that crossed h has ended (G came back to 0)
    for index, w in enumerate(windows):
        g += w.successes * up + (w.trials - w.successes) * down
        if g <= 0:
            g, start = 0.0, index + 1
            over = crossed is not None
            continue
        largest = max(largest, g)
        first = crossed is None and g >= h
        if first or (crossed is not None and not over and g > crossed[2]):
            crossed = (start, index, g)
    return largest, crossed
