"""``max_response_size``, the one size option every action that reads answers takes: a number of
bytes, or one with a unit (``512KiB``, ``1MiB``, ``2 MB``), from 1 KiB to 1 GiB."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from specguard.common.sizes import parse_size

SMALLEST_LIMIT = 1024  # a limit below this would refuse an ordinary error page
LARGEST_LIMIT = 1 << 30


def response_size(value: Any) -> int:
    """``max_response_size`` in bytes; ValueError saying what is accepted."""
    return parse_size(value, SMALLEST_LIMIT, LARGEST_LIMIT)


ResponseSize = Annotated[int, BeforeValidator(response_size)]
