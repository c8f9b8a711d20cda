"""The quantile of a classic histogram: Prometheus's ``histogram_quantile`` bucket algorithm, step
for step, over (upper bound, cumulative count) pairs."""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Iterable


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The q-quantile of classic histogram ``buckets`` (upper bound, cumulative count).

    Prometheus's ``BucketQuantile`` (promql/quantile.go), step for step: sort by upper bound,
    require a +Inf bucket, merge equal bounds, absorb float noise and force monotonic counts,
    interpolate linearly inside the bucket holding the rank (lower bound 0 for the first bucket
    unless its upper bound is <= 0), answer the highest finite bound if the rank falls in the +Inf
    bucket. NaN means no data: no observations, fewer than 2 buckets or no +Inf bucket.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda bucket: bucket[0])
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    uppers: list[float] = []
    counts: list[float] = []
    for upper, count in ordered:  # coalesceBuckets
        if uppers and uppers[-1] == upper:
            counts[-1] += count
        else:
            uppers.append(upper)
            counts.append(count)
    _ensure_monotonic(counts)
    if len(counts) < 2 or counts[-1] == 0:
        return math.nan
    rank = q * counts[-1]
    b = bisect.bisect_left(counts, rank, hi=len(counts) - 1)  # sort.Search(n-1, count >= rank)
    if b == len(counts) - 1:
        return uppers[-2]
    if b == 0 and uppers[0] <= 0:
        return uppers[0]
    start, end, count = 0.0, uppers[b], counts[b]
    if b > 0:
        start = uppers[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # only when rank is 0 too: Go's 0/0 gives NaN where Python would raise
        return math.nan
    return start + (end - start) * (rank / count)


_SMALL_DELTA_TOLERANCE = 1e-12  # promql's smallDeltaTolerance


def _ensure_monotonic(counts: list[float]) -> None:
    """ensureMonotonicAndIgnoreSmallDeltas: ``prev`` stays at the last count accepted."""
    previous = counts[0]
    for i in range(1, len(counts)):
        current = counts[i]
        if current == previous:
            continue
        if _almost_equal(previous, current, _SMALL_DELTA_TOLERANCE) or current < previous:
            counts[i] = previous
            continue
        previous = current


def _almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus's util/almost.Equal (relative comparison, absolute near zero)."""
    if (math.isnan(a) and math.isnan(b)) or a == b:
        return True
    min_normal = sys.float_info.min  # Go's math.Float64frombits(0x0010000000000000)
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < min_normal:
        return diff < epsilon * min_normal
    return diff / min(abs_sum, sys.float_info.max) < epsilon
