"""Which class and pool a request gets: the router's rules evaluated in Python, step for step as
the rendered Lua evaluates them (``specguard_routing.lua``), for ``specguard routing classify`` and
as the oracle the tests hold nginx to.

The steps:

1. A request that is not a POST to ``/v1/completions`` or ``/v1/chat/completions`` is not
   inspected: class ``other``.
2. The body must be JSON (no ``NaN`` or ``Infinity``) and an object: otherwise class ``malformed``
   (reason ``json`` or ``not_object``).
3. Each field some class tests is read from the body: ``stream`` missing or null is false, ``n``
   missing or null is 1 (the API's defaults); ``max_tokens`` is ``max_completion_tokens`` where that
   is given, else ``max_tokens``; ``prompt_chars`` counts the characters of a completion's
   ``prompt`` (a string or a list of strings) or of a chat's messages' text contents. A field of the
   wrong type (``temperature: "hot"``) makes the request ``malformed`` (reason ``field_type``); a
   field missing (or null) is counted, and a condition on it does not hold.
4. The first class whose conditions all hold names the pool; none: class ``default``, the default
   pool. While the fallback flag is engaged, every request goes to the fallback pool, whatever its
   class.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from specguard.config.routing import (
    DEFAULT_CLASS,
    MALFORMED_CLASS,
    OTHER_CLASS,
    PATHS,
    Condition,
    RoutingConfig,
)

MISSING = object()


@dataclass(frozen=True)
class Decision:
    klass: str  # the class the request is labelled with
    pool: str  # where it goes
    malformed: str | None = None  # json | not_object | field_type | unreadable_body
    missing: tuple[str, ...] = ()  # fields some class tests that the body does not give
    fallback: bool = False  # sent to the fallback pool by the flag


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def chars(text: str) -> int:
    """Characters as the router counts them: UTF-8 bytes that do not continue a character."""
    return sum(1 for byte in text.encode("utf-8", "surrogateescape") if byte & 0xC0 != 0x80)


def _list(value: Any) -> bool:
    """A JSON array, as Lua's cjson sees one: it cannot tell ``{}`` from ``[]``, so an empty
    object counts as an empty array."""
    return isinstance(value, list) or value == {}


def prompt_chars(path: str, body: dict[str, Any]) -> int | None:
    """The prompt's length in characters, or None where the body gives no text prompt."""
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return chars(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return sum(chars(p) for p in prompt)
        return None
    messages = body.get("messages")
    if not isinstance(messages, list | dict) or not _list(messages):
        return None
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += chars(content)
        elif isinstance(content, list | dict) and _list(content):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    total += chars(text)
    return total


def read_field(field: str, path: str, body: dict[str, Any]) -> Any:
    """The field's value, MISSING, or raises TypeError for a value of the wrong type."""
    if field == "path":
        return path
    if field == "prompt_chars":
        count = prompt_chars(path, body)
        return MISSING if count is None else count
    if field == "max_tokens":
        value = body.get("max_completion_tokens")
        if value is None:
            value = body.get("max_tokens")
    else:
        value = body.get(field)
    if value is None:
        return {"stream": False, "n": 1}.get(field, MISSING)
    wanted = {"stream": bool, "model": str}.get(field)
    ok = isinstance(value, wanted) if wanted is not None else _number(value)
    if not ok:
        raise TypeError(field)
    return value


def _compare(op: str, value: Any, limit: Any) -> bool:
    if op == "lt":
        return bool(value < limit)
    if op == "le":
        return bool(value <= limit)
    if op == "gt":
        return bool(value > limit)
    if op == "ge":
        return bool(value >= limit)
    if op == "eq":
        return bool(value == limit)
    if op == "ne":
        return bool(value != limit)
    if op == "in":
        return value in limit
    return value not in limit


def holds(condition: Condition, value: Any) -> bool:
    """Whether every operator of ``condition`` holds for ``value`` (never for a missing one)."""
    return value is not MISSING and all(_compare(op, value, limit) for op, limit in condition.ops)


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.S)


def _unpaired_surrogate(text: str) -> bool:
    """Whether a ``\\uXXXX`` escape names half a surrogate pair without its other half, which
    cjson refuses (Python's json takes it)."""
    waiting = False  # a high surrogate seen, its low half due next
    after = -1  # where the last escape ended
    for match in _ESCAPE.finditer(text):
        code = int(match.group(1), 16) if match.group(1) else None
        low = code is not None and 0xDC00 <= code <= 0xDFFF
        if waiting != low or (low and match.start() != after):
            return True
        waiting = code is not None and 0xD800 <= code <= 0xDBFF
        after = match.end()
    return waiting


def parse_body(body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The body as a JSON object, or None and why not (json | not_object). As lua-cjson reads
    JSON: bytes that are not UTF-8 pass through, control characters are allowed in strings, and an
    unpaired surrogate escape is refused."""
    text = body.decode("utf-8", "surrogateescape")
    try:
        data = json.loads(text, parse_constant=_reject_constant, strict=False)
    except ValueError:  # JSONDecodeError among them
        return None, "json"
    except RecursionError:
        return None, "json"
    if "\\u" in text and _unpaired_surrogate(text):
        return None, "json"
    if not isinstance(data, dict) or not body.lstrip(b" \t\r\n").startswith(b"{"):
        return None, "not_object"
    return data, None


def classify(routing: RoutingConfig, method: str, path: str, body: bytes, engaged: bool = False) -> Decision:
    """The class and pool of one request, as the router decides them."""

    def decided(klass: str, pool: str, **kwargs: Any) -> Decision:
        if engaged:
            return Decision(klass, routing.fallback_pool, fallback=True, **kwargs)
        return Decision(klass, pool, **kwargs)

    path = path.split("?", 1)[0]
    if method.upper() != "POST" or path not in PATHS:
        return decided(OTHER_CLASS, routing.default_pool)
    data, why = parse_body(body)
    if data is None:
        return decided(MALFORMED_CLASS, routing.default_pool, malformed=why)
    values: dict[str, Any] = {}
    for field in routing.fields():
        try:
            values[field] = read_field(field, path, data)
        except TypeError:
            return decided(MALFORMED_CLASS, routing.default_pool, malformed="field_type")
    missing = tuple(f for f, v in values.items() if v is MISSING)
    for item in routing.classes:
        if all(holds(c, values[c.field]) for c in item.when):
            return decided(item.name, item.pool, missing=missing)
    return decided(DEFAULT_CLASS, routing.default_pool, missing=missing)
