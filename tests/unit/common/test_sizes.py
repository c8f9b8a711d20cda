"""One reading of sizes for every option that takes one (the daemon's page and body limits, the
actions' max_response_size)."""

from __future__ import annotations

import pytest

from specguard.common.sizes import parse_size


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (512, 512),
        ("512", 512),
        ("1MiB", 2**20),
        ("1.5 MiB", 3 * 2**19),
        ("2MB", 2_000_000),
        (" 64KiB ", 65536),
    ],
)
def test_a_size_is_bytes_or_a_number_with_a_unit(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        ("12 parsecs", {}, "invalid size '12 parsecs': give a number of bytes, or one with a unit"),
        (True, {}, "expected a size like 1MiB, 512KiB or a number of bytes, got True"),
        (1.5, {}, "expected a size like 1MiB"),
        (0, {}, "a size must be at least 1 byte$"),
        (-1, {}, "a size must be at least 1 byte$"),
        (
            "2GiB",
            {"smallest": 1024, "largest": 2**30},
            "a size of 2,147,483,648 bytes is outside 1 KiB to 1 GiB",
        ),
    ],
)
def test_what_is_not_a_size_says_why(value: object, bounds: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_size(value, **bounds)
