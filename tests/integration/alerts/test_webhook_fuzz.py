"""The Alertmanager webhook receiver of a real `specguard run` process, fuzzed with hypothesis.

Each example sends one bad request (a body, a Content-Type and a credential, at least one of them
bad) and, at the same time, one valid delivery, so that the two may share the inbox's group commit.
The bad bodies are random and non-UTF-8 bytes, JSON of the wrong shape or with a wrongly typed
field, truncated payloads, bodies over the size limit (with an honest Content-Length or chunked),
deeply nested JSON, integers Python or SQLite cannot hold, lone surrogates, timestamps that leave
Python's range in UTC and bodies sent with a Content-Encoding (compressed or not, bombs included:
Alertmanager never compresses, so any encoding is refused unread); the bad headers are
missing or wrong Content-Types and missing, wrong, prefixed, Basic or non-ASCII credentials. This
proves the contract in ``daemon/alertmanager/receiver.py``:

- every bad request is answered with the right 4xx (401 before 415 before 413 before 400, the
  order the receiver checks in) and a JSON reason, never a 5xx, and the daemon stays up;
- every valid delivery sent in between is answered 200 and is in the store after the daemon has
  stopped, and nothing of the bad requests is;
- the daemon's log holds no traceback.

One answer may come from aiohttp rather than the receiver and is taken as it is: a plain-text 413.
Values that pydantic's lax mode
reads on purpose ("3" or 3.0 as a count, a number as a Unix time) are not sent as bad ones.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import itertools
import json
import random
import re
import sqlite3
import string
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.am_payloads import alert, fingerprint, message
from tests.processes import Daemon

TOKEN = "fuzz-7f3a9c-s3cret"
LIMIT = 64 * 1024  # server.webhook_max_body_size below
PATH = "/alertmanager"
TIMEOUT = 30.0  # seconds for one request; a local daemon answers in milliseconds

RULES = """\
rules:
  - name: am
    alert:
      match: {alertname: Fuzz}
    actions: [log]
"""


# --- what is sent ------------------------------------------------------------------------------


def _short(value: object, size: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= size else f"{text[:size]}...({len(text)} chars)"


@dataclass(frozen=True, repr=False)
class Body:
    """A body, the answer it deserves on its own (400, 413, or 200 for a valid one) and any other
    answer that is right too, and the headers that go with it (Content-Encoding)."""

    kind: str
    data: bytes
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    also: frozenset[int] = frozenset()
    family: str = "valid"  # the strategy that made it

    def __repr__(self) -> str:
        return f"Body({self.kind}, {len(self.data)} bytes)"


@dataclass(frozen=True, repr=False)
class Header:
    """A header value (None: not sent) and whether the receiver must accept it."""

    kind: str
    value: str | bytes | None
    good: bool

    def __repr__(self) -> str:
        return f"Header({self.kind})"


@dataclass(frozen=True, repr=False)
class Attempt:
    """One bad request: at least one of its parts is bad."""

    body: Body
    content_type: Header
    credential: Header
    chunked: bool

    @property
    def expected(self) -> int:
        # the receiver checks the credential, then the Content-Type and -Encoding, then the size,
        # then the body
        if not self.credential.good:
            return 401
        if not self.content_type.good:
            return 415
        return self.body.status

    @property
    def acceptable(self) -> frozenset[int]:
        if self.credential.good and self.content_type.good:
            return self.body.also | {self.body.status}
        return frozenset({self.expected})

    def describe(self) -> str:
        sent = "chunked" if self.chunked else "with Content-Length"
        return (
            f"body {self.body.kind} ({len(self.body.data)} bytes, {sent}); "
            f"Content-Type {self.content_type.kind}; credential {self.credential.kind}"
        )

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis prints examples with it
        printer.text(repr(self))


# --- strategies ----------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
not_strings = json_values.filter(lambda v: not isinstance(v, str))
not_lists = json_values.filter(lambda v: not isinstance(v, list))
not_objects = json_values.filter(lambda v: not isinstance(v, dict))
# text pydantic cannot read as a number or a time: no digit of any script
no_digits = st.text(st.characters(exclude_categories=("Cs", "Nd", "Nl", "No")), max_size=16)
statuses = st.one_of(
    st.text(max_size=12).filter(lambda s: s not in ("firing", "resolved")),
    st.sampled_from(["FIRING", "Resolved", " firing", "firing ", "pending", "inactive"]),
    not_strings,
)
versions = st.one_of(
    st.text(max_size=6).filter(lambda s: s != "4"),
    st.sampled_from(["3", "4.0", " 4", "v4", "5"]),
    not_strings,
)
# lax pydantic reads "3", 3.0 and true as counts; none of those here
counts = st.one_of(
    st.integers(max_value=-1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    no_digits,
    st.none(),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(0, 3), max_size=2),
    st.integers(min_value=2**63, max_value=10**400),  # more than SQLite's INTEGER holds
)
maps = st.one_of(
    not_objects,
    st.dictionaries(st.text(max_size=8), not_strings, min_size=1, max_size=3),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).flatmap(
        lambda good: st.tuples(st.text(max_size=8), not_strings).map(lambda kv: {**good, kv[0]: kv[1]})
    ),
)
times = st.one_of(
    st.sampled_from(
        [
            "",
            "yesterday",
            "now",
            "2026-12-03T10:00:00",  # no time zone
            "2026-12-03T10:00:00.123456789",
            "2026-12-03 10:00:00",
            "2026-12-03",
            "2026-13-03T10:00:00Z",
            "2026-12-32T10:00:00Z",
            "2026-02-30T10:00:00Z",
            "2026-12-03T24:00:01Z",
            "2026-12-03T10:61:00Z",
            "10:00:00Z",
            "0000-01-01T00:00:00Z",
            "2026-12-03T10:00:00+25:00",
            "2026-12-03T10:00:00 UTC",
            "Thu, 03 Dec 2026 10:00:00 GMT",
            "20261203T100000Z",
        ]
    ),
    st.datetimes().map(lambda d: d.isoformat()),  # naive: no time zone
    no_digits,
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
# RFC 3339 and in range, but out of Python's range once in UTC
out_of_range = st.sampled_from(
    [
        "0001-01-01T00:00:00+14:00",
        "0001-01-01T09:59:59+10:00",
        "0001-01-01T00:00:00.5+00:01",
        "9999-12-31T23:59:59-00:01",
        "9999-12-31T20:00:00-14:00",
    ]
)
DELETE = object()  # a mutation that removes the key

TOP_LEVEL: list[tuple[str, Any]] = [
    ("version", DELETE),
    ("version", versions),
    ("groupKey", DELETE),
    ("groupKey", not_strings),
    ("status", DELETE),
    ("status", statuses),
    ("receiver", not_strings),
    ("externalURL", not_strings),
    ("groupLabels", maps),
    ("truncatedAlerts", counts),
    ("alerts", DELETE),
    ("alerts", not_lists),
]
PER_ALERT: list[tuple[str, Any]] = [
    ("status", DELETE),
    ("status", statuses),
    ("labels", DELETE),
    ("labels", maps),
    ("annotations", maps),
    ("startsAt", DELETE),
    ("startsAt", times | st.none() | out_of_range),
    ("endsAt", times),
    ("generatorURL", not_strings),
    ("fingerprint", DELETE),
    ("fingerprint", st.just("")),
    ("fingerprint", st.text(min_size=129, max_size=200)),
    ("fingerprint", not_strings),
]


def encode(document: Any) -> bytes:
    return json.dumps(document).encode()  # ASCII: a lone surrogate goes out as its \\u escape


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    """A valid payload (never sent with the right headers: it is the good part of a bad request)."""
    alerts = [
        alert(
            {"alertname": "Fuzz", "probe": "rejected", "i": str(i)}
            | draw(st.dictionaries(st.sampled_from(["instance", "job", "model"]), st.text(max_size=12))),
            status=draw(st.sampled_from(["firing", "resolved"])),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    return message(*alerts, receiver=draw(st.text(max_size=12)))


@st.composite
def valid_bodies(draw: st.DrawFn) -> Body:
    return Body("valid payload", encode(draw(payloads())), 200)


@st.composite
def wrong_shapes(draw: st.DrawFn) -> Body:
    document = draw(payloads())
    if draw(st.booleans()):
        key, values = draw(st.sampled_from(TOP_LEVEL))
        target, where = document, key
    else:
        key, values = draw(st.sampled_from(PER_ALERT))
        index = draw(st.integers(0, len(document["alerts"]) - 1))
        target, where = document["alerts"][index], f"alerts.{index}.{key}"
    if values is DELETE:
        del target[key]
        return Body(f"without {where}", encode(document), 400)
    value = draw(values)
    target[key] = value
    return Body(f"{where} = {_short(value)}", encode(document), 400)


@st.composite
def alerts_not_objects(draw: st.DrawFn) -> Body:
    document = draw(payloads())
    index = draw(st.integers(0, len(document["alerts"]) - 1))
    value = draw(not_objects)
    document["alerts"][index] = value
    return Body(f"alerts.{index} = {_short(value)}", encode(document), 400)


@st.composite
def not_payloads(draw: st.DrawFn) -> Body:
    """JSON, but not an object, or an object without what a payload needs."""
    value = draw(not_objects | st.dictionaries(st.text(max_size=12), json_values, max_size=6))
    if isinstance(value, dict):
        value.pop("version", None)
    return Body(f"JSON {_short(value, 40)}", encode(value), 400)


@st.composite
def truncated(draw: st.DrawFn) -> Body:
    data = encode(draw(payloads()))
    cut = draw(st.integers(0, len(data) - 1))
    return Body(f"valid payload cut at byte {cut} of {len(data)}", data[:cut], 400)


BAD_UTF8 = [
    b"\xff",
    b"\xfe\xff",
    b"\xc3",
    b"\xc3(",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\xf8\x88\x80\x80\x80",
]


@st.composite
def not_utf8(draw: st.DrawFn) -> Body:
    document = draw(payloads())
    how = draw(st.sampled_from(["spliced", "latin-1", "utf-16", "utf-32", "bom"]))
    if how == "spliced":
        data = encode(document)
        at = draw(st.integers(0, len(data)))
        bad = draw(st.sampled_from(BAD_UTF8))
        return Body(f"{bad!r} spliced in at byte {at}", data[:at] + bad + data[at:], 400)
    if how == "latin-1":
        document["alerts"][0]["labels"]["city"] = "Zürich"
        return Body(
            "latin-1 encoded", json.dumps(document, ensure_ascii=False).encode("latin-1", "replace"), 400
        )
    if how == "bom":
        return Body("UTF-8 with a byte order mark", b"\xef\xbb\xbf" + encode(document), 400)
    return Body(f"{how} encoded", json.dumps(document).encode(how), 400)


random_bytes = st.binary(max_size=4096).map(lambda data: Body("random bytes", data, 400))


@st.composite
def lone_surrogates(draw: st.DrawFn) -> Body:
    document = draw(payloads())
    text = draw(st.text(max_size=4)) + chr(draw(st.integers(0xD800, 0xDFFF))) + draw(st.text(max_size=4))
    where = draw(
        st.sampled_from(
            ["groupKey", "receiver", "externalURL", "label value", "label name", "annotation", "generatorURL"]
        )
    )
    first = document["alerts"][0]
    if where == "label value":
        first["labels"]["instance"] = text
    elif where == "label name":
        first["labels"][text] = "x"
    elif where == "annotation":
        first["annotations"]["summary"] = text
    elif where == "generatorURL":
        first["generatorURL"] = text
    else:
        document[where] = text
    return Body(f"lone surrogate in {where}: {_short(text, 30)}", encode(document), 400)


@st.composite
def huge_integers(draw: st.DrawFn) -> Body:
    """Integers with more digits than Python converts (4300), or a count SQLite cannot hold."""
    where = draw(
        st.sampled_from(
            ["the body", "truncatedAlerts", "an unknown key", "a label value", "a 64-bit overflow"]
        )
    )
    if where == "a 64-bit overflow":
        document = draw(payloads())
        document["truncatedAlerts"] = count = draw(st.integers(2**63, 10**30))
        return Body(f"truncatedAlerts = {count}", encode(document), 400)
    digits = "9" * draw(st.integers(4301, 20_000))
    if where == "the body":
        return Body(f"a {len(digits)}-digit integer as the body", digits.encode(), 400)
    document = draw(payloads())
    marker = "__HUGE__"
    if where == "truncatedAlerts":
        document["truncatedAlerts"] = marker
    elif where == "an unknown key":
        document["notification_count"] = marker
    else:
        document["alerts"][0]["labels"]["instance"] = marker
    data = encode(document).replace(json.dumps(marker).encode(), digits.encode())
    return Body(f"a {len(digits)}-digit integer in {where}", data, 400)


@st.composite
def out_of_range_times(draw: st.DrawFn) -> Body:
    document = draw(payloads())
    value = draw(out_of_range)
    document["alerts"][0]["startsAt"] = value
    return Body(f"alerts.0.startsAt = {value!r}", encode(document), 400)


@st.composite
def nested(draw: st.DrawFn) -> Body:
    """Deep nesting under the size limit: 400, never a RecursionError."""
    how = draw(st.sampled_from(["lists", "objects", "in a label", "as an alert"]))
    depth = draw(st.one_of(st.integers(2, 2_000), st.integers(2_000, 28_000)))
    if how == "objects":
        depth = min(depth, 10_000)  # 6 bytes a level
        return Body(f"objects nested {depth} deep", b'{"a":' * depth + b"0" + b"}" * depth, 400)
    lists = b"[" * depth + b"]" * depth
    if how == "lists":
        return Body(f"lists nested {depth} deep", lists, 400)
    document = draw(payloads())
    marker = "__NESTED__"
    if how == "in a label":
        document["alerts"][0]["labels"]["instance"] = marker
    else:
        document["alerts"][0] = marker
    return Body(f"lists nested {depth} deep {how}", encode(document).replace(b'"__NESTED__"', lists), 400)


@st.composite
def oversized(draw: st.DrawFn) -> Body:
    size = draw(st.integers(LIMIT + 1, 4 * LIMIT))
    how = draw(st.sampled_from(["filler", "padded payload", "random bytes", "lists nested 100000 deep"]))
    if how == "filler":
        data = b"x" * size
    elif how == "random bytes":
        data = random.Random(draw(st.integers(0, 2**32))).randbytes(size)
    elif how == "padded payload":
        document = draw(payloads())
        document["alerts"][0]["annotations"]["padding"] = "p" * size
        data = encode(document)
    else:
        data = b"[" * 100_000 + b"]" * 100_000
    return Body(f"{how} over the limit", data, 413)


@st.composite
def bad_encodings(draw: st.DrawFn) -> Body:
    """A body that is not what its Content-Encoding says, or that inflates past the limit."""
    encoding = draw(st.sampled_from(["gzip", "deflate"]))
    compress: Callable[[bytes], bytes] = gzip.compress if encoding == "gzip" else zlib.compress
    how = draw(st.sampled_from(["not compressed", "cut short", "a bomb"]))
    if how == "not compressed":
        data = b"{not JSON and not " + encoding.encode() + b"}"
    elif how == "cut short":
        packed = compress(encode(draw(payloads())))
        data = packed[: draw(st.integers(0, len(packed) - 1))]
    else:
        data = compress(b" " * draw(st.integers(LIMIT + 1, 4 * 2**20)))
    # Refused for its encoding (415) before anything is read or inflated, whatever it holds.
    return Body(f"{how} as {encoding}", data, 415, {"Content-Encoding": encoding})


BAD_BODIES: dict[str, st.SearchStrategy[Body]] = {
    "random bytes": random_bytes,
    "not UTF-8": not_utf8(),
    "not a payload": not_payloads(),
    "wrong shape": wrong_shapes(),
    "alert not an object": alerts_not_objects(),
    "truncated": truncated(),
    "oversized": oversized(),
    "nested": nested(),
    "huge integer": huge_integers(),
    "lone surrogate": lone_surrogates(),
    "time out of range": out_of_range_times(),
    "bad Content-Encoding": bad_encodings(),
}


def _tagged(bodies: st.SearchStrategy[Body], family: str) -> st.SearchStrategy[Body]:
    return bodies.map(lambda body: replace(body, family=family))


GOOD_TYPES = ["application/json", "application/json; charset=utf-8", "application/json;charset=UTF-8"]
BAD_TYPES = [
    "",
    "text/plain",
    "text/plain; charset=utf-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=fuzz",
    "text/json",
    "application/jsonx",
    "application/json-seq",
    "application/ld+json",
    "application/problem+json",
    "application/*",
    "*/*",
    "json",
    "application",
    "application/octet-stream",
]
good_types = st.sampled_from(GOOD_TYPES).map(lambda value: Header(repr(value), value, True))
bad_types = st.one_of(
    st.just(Header("missing", None, False)),
    st.sampled_from(BAD_TYPES).map(lambda value: Header(repr(value), value, False)),
    st.from_regex(r"\A[a-z]{1,12}/[a-z0-9.+-]{1,16}\Z")
    .filter(lambda value: value != "application/json")
    .map(lambda value: Header(repr(value), value, False)),
    st.sampled_from([b"application/js\xf6n", b"application/json\xff", "application/jsön".encode()]).map(
        lambda value: Header(f"non-ASCII {value!r}", value, False)
    ),
)


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


WRONG_CREDENTIALS = [
    "",
    "Bearer",
    "Bearer ",
    TOKEN,
    f"Token {TOKEN}",
    f"Bearer  {TOKEN}",
    f"Bearer {TOKEN}x",
    f"Bearer x{TOKEN}",
    f"Bearer {TOKEN}{TOKEN}",
    f"Bearer {TOKEN} {TOKEN}",
    f"Bearer {TOKEN.upper()}",
    f"Bearer {base64.b64encode(TOKEN.encode()).decode()}",
    _basic(f"specguard:{TOKEN}"),
    _basic(f":{TOKEN}"),
    _basic(TOKEN),
    f"{TOKEN} Bearer",
]
# printable, no space: a random token is never the right one by accident of stripping
TOKEN_CHARACTERS = string.ascii_letters + string.digits + string.punctuation
good_credential = st.just(Header("right", f"Bearer {TOKEN}", True))
bad_credentials = st.one_of(
    st.just(Header("missing", None, False)),
    st.sampled_from(WRONG_CREDENTIALS).map(lambda value: Header(_short(value, 40), value, False)),
    st.integers(0, len(TOKEN) - 1).map(
        lambda cut: Header(f"right prefix of {cut} characters", f"Bearer {TOKEN[:cut]}", False)
    ),
    st.text(TOKEN_CHARACTERS, min_size=1, max_size=64)
    .filter(lambda token: token != TOKEN)
    .map(lambda token: Header(f"random {_short(token, 30)}", f"Bearer {token}", False)),
    st.sampled_from(
        [
            f"Bearer {TOKEN}é".encode("latin-1"),
            f"Bearer {TOKEN}é".encode(),
            f"Bearer {TOKEN[:-1]}\xf6".encode("latin-1"),
            b"Bearer \xff\xfe\xfd",
        ]
    ).map(lambda value: Header(f"non-ASCII {value!r}", value, False)),
    st.lists(st.integers(0x80, 0xFF), min_size=1, max_size=24).map(
        lambda high: Header(f"non-ASCII bytes {bytes(high)!r}", b"Bearer " + bytes(high), False)
    ),
)


# Which parts of a request are bad. With a bad body, mostly the body alone: a bad header hides it.
BODY_BAD = [{"body"}] * 4 + [
    {"body", "content type"},
    {"body", "credential"},
    {"body", "content type", "credential"},
]
HEADERS_BAD = [{"content type"}, {"credential"}, {"content type", "credential"}]


@st.composite
def attempts(draw: st.DrawFn, bad_bodies: st.SearchStrategy[Body], parts: list[set[str]]) -> Attempt:
    bad = draw(st.sampled_from(parts))
    return Attempt(
        body=draw(bad_bodies if "body" in bad else valid_bodies()),
        content_type=draw(bad_types if "content type" in bad else good_types),
        credential=draw(bad_credentials if "credential" in bad else good_credential),
        chunked=draw(st.booleans()),
    )


# --- sending and judging -------------------------------------------------------------------------


def chunks(data: bytes, size: int = 8192) -> Iterator[bytes]:
    """The body as a generator: requests sends it chunked, without a Content-Length."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def post(
    url: str,
    data: bytes,
    content_type: str | bytes | None,
    credential: str | bytes | None,
    chunked: bool,
    **extra: str,
) -> requests.Response:
    headers: dict[str, str | bytes] = dict(extra)
    if content_type is not None:
        headers["Content-Type"] = content_type
    if credential is not None:
        headers["Authorization"] = credential
    return requests.post(url, data=chunks(data) if chunked else data, headers=headers, timeout=TIMEOUT)


def judge(attempt: Attempt, answer: requests.Response) -> str | None:
    """Why the answer to ``attempt`` breaks the contract, or None."""
    expected = attempt.expected
    if answer.status_code in attempt.acceptable:
        expected = answer.status_code
    shown = f"{answer.status_code} {answer.text[:200]!r}"
    json_answer = answer.headers.get("Content-Type", "").startswith("application/json")
    if answer.status_code != expected:
        return f"expected {expected}, got {shown}"
    if json_answer:
        try:
            reason = answer.json().get("reason")
        except ValueError:
            return f"the JSON answer does not parse: {shown}"
    elif expected == 413 and answer.text.strip():
        return None  # aiohttp's own 413 (plain text) would do; the receiver's is JSON so far
    else:
        return f"the answer is not JSON: {shown}"
    if not isinstance(reason, str) or not reason:
        return f"no reason in the answer: {shown}"
    if expected == 401:
        missing = attempt.credential.value in (None, "", b"")
        wanted = "missing bearer token" if missing else "wrong bearer token"
        if reason != wanted or answer.headers.get("WWW-Authenticate") != "Bearer":
            return f"expected {wanted!r} and WWW-Authenticate: Bearer, got {shown}"
    if expected == 415 and "Content-Type" not in reason and "Content-Encoding" not in reason:
        return f"the reason does not name the Content-Type or Content-Encoding: {shown}"
    if expected == 413 and f"over the limit of {LIMIT} bytes" not in reason:
        return f"the reason does not give the limit: {shown}"
    return None


class ServerError(AssertionError):
    """A 5xx (or no answer) to a bad request."""


class Accepted(AssertionError):
    """A 2xx to a bad request."""


def check(attempt: Attempt, answer: requests.Response) -> None:
    """Raise when the answer breaks the contract. Each kind of failure is its own exception, raised
    from its own line, so that hypothesis reports each kind once instead of the first only."""
    problem = judge(attempt, answer)
    if problem is None:
        return
    if answer.status_code >= 500:
        raise ServerError(f"{attempt.describe()}: {problem}")
    if answer.status_code < 300:
        raise Accepted(f"{attempt.describe()}: {problem}")
    raise AssertionError(f"{attempt.describe()}: {problem}")


@dataclass
class Tally:
    """What the examples sent: the fingerprint of every valid delivery answered 200, and the kinds of
    bad requests (to check that every kind was tried)."""

    stored: list[str] = field(default_factory=list)
    expected: Counter[int] = field(default_factory=Counter)
    bodies: Counter[str] = field(default_factory=Counter)
    numbers: Iterator[int] = field(default_factory=itertools.count)


# --- the daemon ----------------------------------------------------------------------------------


def wait_until_serving(daemon: Daemon, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    assert daemon.process is not None
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            pytest.fail(
                f"specguard exited with {daemon.process.returncode}:\n{daemon.log.read_text()[-3000:]}"
            )
        try:
            requests.get(daemon.url + "/healthz", timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.1)
    pytest.fail(f"specguard did not answer /healthz in {timeout:.0f} s:\n{daemon.log.read_text()[-3000:]}")


@pytest.fixture
def daemon(tmp_path: Path, unused_tcp_port_factory: Callable[[], int]) -> Iterator[Daemon]:
    port, nobody = unused_tcp_port_factory(), unused_tcp_port_factory()
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}, webhook_token_file: token, webhook_max_body_size: 64KiB}}\n"
        "state_dir: state\n"
        "interval: 1s\n"
        f"sources: {{scrape: {{targets: ['http://127.0.0.1:{nobody}/metrics'], timeout: 1s}}}}\n"
        "rules: [rules.yaml]\n"
    )
    running = Daemon(config, port, tmp_path / "specguard.log")
    running.start()
    try:
        wait_until_serving(running)
        yield running
    finally:
        if running.process is not None and running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def settle(path: Path, timeout: float = 30.0) -> None:
    """Until every stored alert has been acted on: a stop in the middle of it waits out the runtime's
    grace period (20 s, longer than Daemon.stop waits) instead of stopping at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            (left,) = db.execute("SELECT COUNT(*) FROM alert_receipts WHERE processed IS NULL").fetchone()
        if left == 0:
            return
        time.sleep(0.1)
    pytest.fail(f"{left} stored alerts were not acted on in {timeout:.0f} s")


# Examples per hypothesis run: each family of bad bodies has a run of its own, so that every family
# is tried whatever hypothesis favours, and so have bad headers in front of valid bodies.
RUNS: dict[str, int] = {family: 30 for family in BAD_BODIES} | {"wrong shape": 100, "headers": 60}


def strategy_of(run: str) -> st.SearchStrategy[Attempt]:
    if run == "headers":
        return attempts(valid_bodies(), HEADERS_BAD)
    return attempts(_tagged(BAD_BODIES[run], run), BODY_BAD)


def tracebacks(log: Path) -> list[str]:
    """The last line of each kind of traceback in the daemon's log, with its log message."""
    found: dict[str, tuple[str, int]] = {}
    for line in log.read_text().splitlines():
        if "Traceback" not in line:
            continue
        try:
            record = json.loads(line)
            last = f"{record['msg']}: {record['exc'].strip().splitlines()[-1]}"[:300]
        except (ValueError, KeyError, IndexError, AttributeError):
            last = line[:300]
        kind = re.sub(r"\\u[0-9a-f]{4}|\d+", "#", last)  # one kind whatever the character or size
        first, count = found.get(kind, (last, 0))
        found[kind] = (first, count + 1)
    return [f"traceback in the log ({count}x): {last}" for last, count in found.values()]


# --- the test ------------------------------------------------------------------------------------


def test_bad_requests_are_4xx_with_a_reason_and_valid_deliveries_in_between_are_all_stored(
    daemon: Daemon, tmp_path: Path
) -> None:
    url = daemon.url + PATH
    tally = Tally()
    process = daemon.process
    assert process is not None

    def bad_and_valid_at_once(pool: ThreadPoolExecutor, attempt: Attempt) -> None:
        """Both requests at once, so that they may share the inbox's group commit."""
        number = next(tally.numbers)
        labels = {"alertname": "Fuzz", "delivery": str(number)}
        valid = encode(message(alert(labels), group_key=f'{{}}:{{delivery="{number}"}}'))
        bad = pool.submit(
            post,
            url,
            attempt.body.data,
            attempt.content_type.value,
            attempt.credential.value,
            attempt.chunked,
            **attempt.body.headers,
        )
        good = pool.submit(post, url, valid, "application/json", f"Bearer {TOKEN}", number % 2 == 1)
        try:
            delivered: requests.Response | str = good.result()
        except requests.RequestException as exc:
            delivered = f"no answer: {_short(exc, 200)}"
        if isinstance(delivered, requests.Response) and delivered.status_code == 200:
            tally.stored.append(fingerprint(labels))  # whatever the other answer was
        try:
            answer = bad.result()
        except requests.RequestException as exc:
            raise ServerError(f"{attempt.describe()}: no answer: {_short(exc, 200)}") from None
        check(attempt, answer)
        if isinstance(delivered, requests.Response):
            delivered = f"{delivered.status_code} {delivered.text[:200]!r}"
        assert delivered.startswith("200 "), f"valid delivery beside {attempt.describe()}: {delivered}"
        tally.expected[attempt.expected] += 1
        if attempt.credential.good and attempt.content_type.good:
            tally.bodies[attempt.body.family] += 1  # only then is the body judged
        assert process.poll() is None, (
            f"specguard exited with {process.returncode} after {attempt.describe()}"
        )

    # Every run goes on when one fails, so that one test run shows every kind of failure.
    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for run, examples in RUNS.items():

            @settings(
                max_examples=examples,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(attempt=strategy_of(run))
            def fuzz(attempt: Attempt) -> None:
                bad_and_valid_at_once(pool, attempt)

            try:
                fuzz()
            except Exception as exc:  # the failure hypothesis found (and shrank), or several
                found = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
                problems += [f"{run}: {str(one).splitlines()[0][:500]}" for one in found]

    database = tmp_path / "state" / "specguard.db"
    settle(database)
    assert daemon.stop() == 0
    print(f"{len(tally.stored)} valid deliveries stored; bad requests by answer {dict(tally.expected)}")
    print(f"bad bodies judged, by family: {dict(tally.bodies)}")
    if not problems:
        assert set(tally.expected) == {400, 401, 413, 415}, tally.expected
        assert set(tally.bodies) == set(BAD_BODIES), tally.bodies

    with contextlib.closing(sqlite3.connect(database)) as db:
        marks = ",".join("?" * len(tally.stored))
        (receipts,) = db.execute(
            f"SELECT COUNT(*) FROM alert_receipts WHERE fingerprint IN ({marks})", tally.stored
        ).fetchone()
        if receipts != len(tally.stored):
            problems.append(f"{len(tally.stored)} valid deliveries were answered 200, {receipts} are stored")
        (deliveries,) = db.execute("SELECT COUNT(*) FROM deliveries").fetchone()
        if deliveries != len(tally.stored):
            problems.append(f"{deliveries} deliveries stored for {len(tally.stored)} valid ones answered 200")
        others = db.execute(
            f"SELECT labels FROM alert_receipts WHERE fingerprint NOT IN ({marks}) LIMIT 3", tally.stored
        ).fetchall()
        if others:
            problems.append(f"alerts of bad requests were stored: {_short(others, 300)}")

    problems += tracebacks(daemon.log)
    assert not problems, "\n".join(problems)
