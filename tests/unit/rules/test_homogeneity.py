"""The warm-up's homogeneity check (common/homogeneity.py): one level of traffic passes, a shift
either way is found and located, and the estimates it judges by are ones a shift cannot move.

Healthy warm-ups come from the collapse benchmark's model of vLLM traffic (requests in flight, each
with its own acceptance and a life of 30 s on average, chain drafts), which
tests/unit/daemon/test_collapse_bench_traffic.py pins to the simulator's.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from benchmarks.collapse_traffic import Traffic
from specguard.common.homogeneity import (
    FALSE_REJECTION,
    MOVING_RANGE,
    Window,
    check,
    moving_range_noise,
    weighted_median,
)

HOUR = 720  # 5 s windows: the shipped rule's warm-up
DROPS = (0.12, 0.3)  # the shipped rule's


def benchmark_windows(seed: int, levels: np.ndarray, requests: int = 16, k: int = 3) -> list[Window]:
    counts = Traffic(np.random.default_rng(seed), k, requests).windows(levels)
    trials = counts["accepted"] + counts["failures"]
    return [Window(float(s), float(n)) for s, n in zip(counts["accepted"], trials, strict=True)]


def steady(
    rng: random.Random, levels: list[float], trials: float = 1000.0, spread: float = 0.02
) -> list[Window]:
    """Windows whose α̂ is their level plus a normal wobble of ``spread``."""
    out = []
    for level in levels:
        alpha = min(0.99, max(0.01, rng.gauss(level, spread)))
        n = trials if level > 0.3 else 0.45 * trials  # a collapsed chain ends its drafts sooner
        out.append(Window(round(alpha * n), n))
    return out


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("requests", [32, 16, 4])
def test_healthy_warm_ups_hold_one_level(requests: int, k: int) -> None:
    # An hour at 0.75 with 32, 16 or 4 requests in flight: the windows wander with the requests
    # (with 4, a window's acceptance strays 0.1 and more from the hour's), yet hold one level.
    for seed in range(8):
        windows = benchmark_windows(seed, np.full(HOUR, 0.75), requests, k)
        result = check(windows, DROPS)
        assert result.homogeneous, (seed, result)
        assert result.evidence < result.threshold


def test_the_threshold_bounds_false_rejections_by_the_windows_and_the_cusums() -> None:
    # Two drops, each checked down and up from the median: four CUSUMs over the hour's windows.
    result = check(steady(random.Random(1), [0.6] * HOUR), DROPS)
    assert result.threshold == pytest.approx(math.log(4 * HOUR / FALSE_REJECTION))
    # At 0.75, a rise of 0.3 is no acceptance: three CUSUMs.
    result = check(steady(random.Random(1), [0.75] * HOUR), DROPS)
    assert result.threshold == pytest.approx(math.log(3 * HOUR / FALSE_REJECTION))


@pytest.mark.parametrize("requests", [16, 4])
def test_five_minutes_of_collapse_in_the_hour_are_found_where_they_are(requests: int) -> None:
    levels = np.full(HOUR, 0.75)
    levels[300:360] = 0.05
    windows = benchmark_windows(7, levels, requests)
    result = check(windows, DROPS)
    assert result.shift is not None and result.shift.below
    assert 295 <= result.shift.begin <= 300 and 359 <= result.shift.end <= 362
    assert result.shift.alpha < 0.2
    # The rest of the hour sets the centre and the noise, as if the collapse were not there.
    clean = check(benchmark_windows(7, np.full(HOUR, 0.75), requests), DROPS)
    assert result.center == pytest.approx(clean.center, abs=0.01)
    assert result.noise == pytest.approx(clean.noise, rel=0.2)


def test_traffic_alternating_between_healthy_and_collapsed_is_not_one_level() -> None:
    # 90 s at 0.8, 90 s at 0.05, for the hour: the median sits in the healthy level (its windows
    # hold more trials), the moving range sees the wobble within each level, and the collapsed
    # windows, left out of phi, are judged against it.
    rng = random.Random(3)
    levels = [0.8 if (w // 18) % 2 == 0 else 0.05 for w in range(HOUR)]
    result = check(steady(rng, levels), DROPS)
    assert result.shift is not None and result.shift.below
    assert result.shift.begin == 18  # the first collapsed window
    assert result.center == pytest.approx(0.8, abs=0.02)
    assert result.noise < 0.05 and result.phi < 10
    assert result.evidence > 10 * result.threshold


def test_a_warm_up_mostly_collapsed_finds_the_healthy_part_above_it() -> None:
    # 47 minutes collapsed, then 13 healthy: most trials are collapsed ones, so the median is the
    # collapsed level, and the shift is the recovery, found from its first window: the windows
    # before it are the ones to let go.
    levels = [0.05] * 560 + [0.8] * 160
    result = check(steady(random.Random(4), levels), DROPS)
    assert result.center < 0.1
    assert result.shift is not None and not result.shift.below
    assert result.shift.begin == 560 and result.shift.alpha > 0.7


def test_a_step_smaller_than_the_drops_passes() -> None:
    # 0.75 then 0.70: a twelfth of the smallest drop's worth of difference, not a shift to check for.
    levels = [0.75] * 360 + [0.70] * 360
    assert check(steady(random.Random(5), levels), DROPS).homogeneous


def test_the_median_is_weighted_by_trials_and_the_noise_comes_from_neighbours() -> None:
    assert weighted_median([0.8, 0.05, 0.8, 0.05], [1000, 450, 1000, 450]) == 0.8
    assert weighted_median([0.1, 0.2, 0.3], [1, 1, 1]) == 0.2
    # A level shift moves one difference of many: the moving range keeps the wobble's size.
    windows = [Window(round(a * 1000), 1000) for a in [0.80, 0.81, 0.80, 0.81, 0.10, 0.11, 0.10, 0.11]]
    assert moving_range_noise(windows) == pytest.approx(0.01 / MOVING_RANGE, abs=1e-9)
    # Windows that do not follow one another are no neighbours.
    apart = [Window(800, 1000), Window(100, 1000, follows=False), Window(110, 1000)]
    assert moving_range_noise(apart) == pytest.approx(0.01 / MOVING_RANGE)
    assert moving_range_noise([Window(800, 1000)]) == 0.0


def test_windows_all_accepted_have_no_level_to_tell_apart() -> None:
    result = check([Window(500, 500)] * 10, DROPS)
    assert result.homogeneous and result.center == 1.0


@pytest.mark.parametrize(
    ("windows", "drops", "rate", "message"),
    [
        ([], DROPS, 0.01, "no windows to check"),
        ([Window(80, 100)], (), 0.01, "the drops to check for are above 0"),
        ([Window(80, 100)], (0.1, 0.0), 0.01, "the drops to check for are above 0"),
        ([Window(80, 100)], DROPS, 1.5, "a false-rejection rate is in (0, 1)"),
    ],
)
def test_a_check_without_windows_drops_or_a_rate_says_so(
    windows: list[Window], drops: tuple[float, ...], rate: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check(windows, drops, rate)
