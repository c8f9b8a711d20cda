"""Answers read as from a stranger: bodies up to a limit (declared or not), JSON without
non-finite numbers, and Retry-After as seconds or an HTTP date, finite and capped."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest

from specguard.common.http import TooLarge, json_limited, read_limited, retry_after, size_text


class _Endless:
    """A body that never ends: 64 KiB a read, counted."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self.given = 0

    async def read(self, n: int = -1) -> bytes:
        if self.total is not None and self.given >= self.total:
            return b""
        size = n if self.total is None else min(n, self.total - self.given)
        self.given += size
        return b"x" * size


class _Response:
    def __init__(self, content: Any, headers: dict[str, str] | None = None) -> None:
        self.headers = headers or {}
        self.content = content


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, n: int = -1) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


async def test_an_endless_body_is_cut_at_the_limit_having_read_little_more() -> None:
    body = _Endless()
    with pytest.raises(TooLarge, match="passed max_response_size 1 MiB"):
        await read_limited(_Response(body), 1024 * 1024)
    assert body.given <= 1024 * 1024 + 64 * 1024


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    body = _Endless()
    with pytest.raises(TooLarge, match="838,860,800 bytes, over max_response_size 1 MiB"):
        await read_limited(_Response(body, {"Content-Length": str(800 * 1024 * 1024)}), 1024 * 1024)
    assert body.given == 0


async def test_a_body_within_the_limit_is_read_whole_even_if_its_length_lied() -> None:
    assert await read_limited(_Response(_Body(b"hello"), {"Content-Length": "3"}), 10) == b"hello"
    assert await read_limited(_Response(_Endless(1000)), 1000) == b"x" * 1000
    with pytest.raises(TooLarge):
        await read_limited(_Response(_Endless(1001), {"Content-Length": "5"}), 1000)


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}', '{"a": -Infinity}'])
async def test_json_with_non_finite_numbers_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        await json_limited(_Response(_Body(text.encode())))


async def test_json_within_the_limit_is_parsed() -> None:
    assert await json_limited(_Response(_Body(b'{"ok": true, "n": 1.5}'))) == {"ok": True, "n": 1.5}
    with pytest.raises(ValueError):
        await json_limited(_Response(_Body(b"<html>")))


NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", 30.0),
        (" 2.5 ", 2.5),
        ("0", 0.0),
        ("999999999", 300.0),  # years: capped
        ("inf", None),
        ("Infinity", None),
        ("nan", None),
        ("-5", None),
        ("soon", None),
        ("", None),
        (None, None),
        (format_datetime(datetime(2026, 12, 5, 12, 1, 0, tzinfo=UTC), usegmt=True), 60.0),
        (format_datetime(datetime(2026, 12, 5, 11, 0, 0, tzinfo=UTC), usegmt=True), 0.0),  # past: now
        (format_datetime(datetime(2030, 1, 1, tzinfo=UTC), usegmt=True), 300.0),
    ],
)
def test_retry_after_is_seconds_or_an_http_date_finite_and_capped(
    value: str | None, expected: float | None
) -> None:
    assert retry_after(value, NOW, 300.0) == expected


def test_sizes_are_said_in_their_unit() -> None:
    assert [size_text(n) for n in (1 << 20, 512 << 10, 100, 1 << 30, 1500)] == [
        "1 MiB", "512 KiB", "100 bytes", "1 GiB", "1500 bytes",
    ]  # fmt: skip
