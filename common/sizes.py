"""Sizes in the configuration (``max_page_size: 16MiB``, ``max_response_size: 512KiB``): a number
of bytes, or a number with a unit, decimal (KB, MB, GB) or binary (KiB, MiB, GiB)."""

from __future__ import annotations

import re
from typing import Any

from specguard.common.http import size_text

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB)?")
_UNITS = {None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def parse_size(value: Any, smallest: int = 1, largest: int | None = None) -> int:
    """The size in bytes; ValueError saying what is accepted, or the bounds it is outside."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a size like 1MiB, 512KiB or a number of bytes, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value.strip())
        if match is None:
            raise ValueError(
                f"invalid size {value!r}: give a number of bytes, or one with a unit (B, KB, MB, GB, "
                "KiB, MiB, GiB), e.g. 1MiB or 512KiB"
            )
        size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if largest is not None and not smallest <= size <= largest:
        raise ValueError(f"a size of {size:,} bytes is outside {size_text(smallest)} to {size_text(largest)}")
    if size < smallest:
        raise ValueError(f"a size must be at least {size_text(smallest)}")
    return size
