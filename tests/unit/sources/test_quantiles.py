"""The quantile of a classic histogram is Prometheus's ``histogram_quantile``, bucket for bucket."""

from __future__ import annotations

import math

import pytest

from specguard.sources.quantiles import bucket_quantile


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # unsorted input is sorted by upper bound
        (0.5, [(math.inf, 10.0), (2.0, 10.0), (1.0, 5.0)], 1.0),
        # equal bounds are merged: (1, 4), (2, 4), (+Inf, 4); rank 2 -> 1 * 2 / 4
        (0.5, [(1.0, 2.0), (1.0, 2.0), (2.0, 4.0), (math.inf, 4.0)], 0.5),
        # a decrease is lifted to the previous count: 5, 5, 8, 8; rank 5.6 -> 2 + 1 * 0.6 / 3
        (0.7, [(1.0, 5.0), (2.0, 3.0), (3.0, 8.0), (math.inf, 8.0)], 2.2),
        # a first bucket with a bound <= 0 answers its bound
        (0.25, [(-1.0, 2.0), (0.0, 4.0), (math.inf, 4.0)], -1.0),
        # rank in the +Inf bucket: the highest finite bound
        (0.99, [(1.0, 1.0), (2.0, 2.0), (math.inf, 10.0)], 2.0),
    ],
)
def test_bucket_quantile_matches_prometheus(
    q: float, buckets: list[tuple[float, float]], expected: float
) -> None:
    assert bucket_quantile(q, buckets) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "buckets",
    [
        [(1.0, 3.0), (2.0, 5.0)],  # no +Inf bucket
        [(math.inf, 5.0)],  # fewer than 2 buckets
        [(1.0, 0.0), (math.inf, 0.0)],  # no observations
        [],
    ],
)
def test_bucket_quantile_without_an_answer_is_nan(buckets: list[tuple[float, float]]) -> None:
    assert math.isnan(bucket_quantile(0.5, buckets))


def test_bucket_quantile_outside_zero_to_one() -> None:
    buckets = [(1.0, 1.0), (math.inf, 1.0)]
    assert bucket_quantile(-0.1, buckets) == -math.inf
    assert bucket_quantile(1.1, buckets) == math.inf
    assert math.isnan(bucket_quantile(math.nan, buckets))
