"""Answers from the services specguard acts through (a flag API, Slack, a canary's vLLM, vLLM's
``/health``), read as from a stranger: the body up to a size limit, and ``Retry-After`` only when it
is a finite number of seconds or an HTTP date, capped.

The functions take aiohttp's response duck-typed (``headers``, ``content``), so this module needs
no import of aiohttp and stays at the bottom of the layers."""

from __future__ import annotations

import json
import math
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

MAX_RESPONSE_SIZE = 1024 * 1024  # bytes: the default `max_response_size` of every action
CHUNK = 64 * 1024


class TooLarge(Exception):
    """The answer's body is over the limit; the message says how large and what the limit is."""


class _Content(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class _Response(Protocol):
    @property
    def headers(self) -> Any: ...

    @property
    def content(self) -> _Content: ...


def size_text(limit: int) -> str:
    """``1 MiB``, ``512 KiB``, ``100 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= size and limit % size == 0:
            return f"{limit // size} {unit}"
    return f"{limit} byte{'s' if limit != 1 else ''}"


async def read_limited(response: _Response, limit: int = MAX_RESPONSE_SIZE) -> bytes:
    """The body, or TooLarge as soon as it is known to be over ``limit`` bytes: from a declared
    Content-Length before anything is read, else once the bytes read pass it (chunked, or a
    Content-Length that lied). At most ``limit`` + one chunk is ever held."""
    declared = response.headers.get("Content-Length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            length = None
        if length is not None and length > limit:
            raise TooLarge(
                f"the answer's body is {length:,} bytes, over max_response_size {size_text(limit)}"
            )
    parts: list[bytes] = []
    held = 0
    while True:
        chunk = await response.content.read(CHUNK)
        if not chunk:
            return b"".join(parts)
        held += len(chunk)
        if held > limit:
            raise TooLarge(f"the answer's body passed max_response_size {size_text(limit)}")
        parts.append(chunk)


async def text_limited(response: _Response, limit: int = MAX_RESPONSE_SIZE) -> str:
    """The body as text (UTF-8, undecodable bytes replaced), read with ``read_limited``."""
    return (await read_limited(response, limit)).decode("utf-8", "replace")


async def json_limited(response: _Response, limit: int = MAX_RESPONSE_SIZE) -> Any:
    """The body as JSON, read with ``read_limited``; ValueError when it is not JSON. Non-finite
    numbers (``NaN``, ``Infinity``, ``1e999``) are refused: no answer can mean them."""
    return strict_json((await read_limited(response, limit)).decode("utf-8", "replace"))


def strict_json(text: str) -> Any:
    """``text`` as JSON, refusing non-finite numbers (``NaN``, ``Infinity``, ``1e999``) with
    ValueError as it refuses what is not JSON."""
    return json.loads(text, parse_constant=_refuse, parse_float=_finite)


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a number an answer can mean")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def retry_after(value: str | None, now: float, cap: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110: delay-seconds or an HTTP date),
    at most ``cap``; None when there is none or it cannot be read (negative, not finite, neither
    form), so the caller's own backoff applies."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT
            return None
        seconds = when.timestamp() - now
        seconds = max(0.0, seconds)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, cap)
