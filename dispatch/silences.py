"""Silences: an operator holds a rule's actions back for a while ("we are deploying a new draft
model, expect low acceptance for 2h"). A silence names a rule (a glob: ``acceptance_*``), label
matchers as a rule's ``match:`` takes them, an end and a reason; while it lasts, a firing it
matches runs no action (recorded, with the silence's id and reason, as skipped). It ends by
itself, or earlier with ``expire``.

Kept in the store (``silences``), so the CLI, the HTTP API and the daemon share them, and a
silence added while the daemon runs holds back its very next firing.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from aiohttp import web

from specguard.config.schema import DEFAULT_MAX_SILENCE
from specguard.dispatch import api
from specguard.dispatch.api import plain
from specguard.rules.durations import format_duration, parse_duration
from specguard.rules.matchers import OPS, all_match, parse_matchers
from specguard.store.connection import transaction

log = logging.getLogger("specguard.silences")

_MATCH = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*)$")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_REASON = 500
MAX_NAME = 200  # a rule glob, an author, a matcher's value
MAX_ID = 2**63 - 1  # SQLite's largest integer: no silence has a larger id


@dataclass(frozen=True)
class Silence:
    id: int
    rule: str
    match: dict[str, Any]
    starts: float
    ends: float
    reason: str
    author: str
    created: float
    expired: float | None

    def active(self, at: float) -> bool:
        return self.expired is None and self.starts <= at < self.ends

    def takes(self, rule: str, labels: Mapping[str, str]) -> bool:
        return fnmatch.fnmatchcase(rule, self.rule) and all_match(parse_matchers(self.match), labels)


def parse_match(items: Sequence[str]) -> dict[str, Any]:
    """``["instance=vllm-a:8000", "model=~llama.*"]`` as a rule's ``match:`` mapping. Raises
    ValueError naming the item."""
    out: dict[str, Any] = {}
    for item in items:
        found = _MATCH.match(item)
        if found is None:
            raise ValueError(f"{item!r}: give label=value, label!=value, label=~regex or label!~regex")
        label, op, value = found.groups()
        if label in out:
            raise ValueError(f"{item!r}: label {label} is matched twice")
        out[label] = value if op == "=" else {op: value}
    parse_matchers(out)  # a bad regex says so here
    return out


def check(
    rule: str,
    match: Mapping[str, Any],
    starts: float,
    ends: float,
    reason: str,
    longest: float = DEFAULT_MAX_SILENCE,
) -> None:
    """Raises ValueError with what is wrong with a silence about to be added, naming the field.
    ``longest``: the longest silence allowed (``server.max_silence``)."""
    if not rule.strip():
        raise ValueError("rule: name the rule (a glob such as acceptance_* is fine)")
    plain("rule", rule, MAX_NAME)
    check_match(match)
    if not (math.isfinite(starts) and math.isfinite(ends)):
        raise ValueError("for: give a finite duration, e.g. 2h")
    if not ends > starts:
        raise ValueError("the silence must end after it starts (give a positive duration)")
    if ends - starts > longest:
        raise ValueError(
            f"for: {_shown(ends - starts)} is longer than the longest silence, "
            f"{_shown(longest)} (server.max_silence)"
        )
    if not reason.strip():
        raise ValueError("reason: say why, for whoever is on call next")
    plain("reason", reason, MAX_REASON)


def _shown(seconds: float) -> str:
    """``30d`` rather than ``4w2d``: days are what a silence is thought of in."""
    days, rest = divmod(seconds, 86400.0)
    return f"{days:.0f}d" if days and not rest else format_duration(seconds)


def check_match(match: Any) -> None:
    """Raises ValueError naming the matcher when ``match`` is not label names mapped to a string or
    to ``{op: string}``: a silence's matchers are compared with label values, which are strings."""
    if not isinstance(match, Mapping):
        raise ValueError('match: a mapping as in a rule, or a list such as ["instance=a:8000"]')
    for label, spec in match.items():
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            shown = label if isinstance(label, str) else repr(label)
            plain("match", shown, MAX_NAME)
            raise ValueError(
                f"match: {shown!r} is not a label name (letters, digits and _, not first a digit)"
            )
        field = f"match.{label}"
        if isinstance(spec, Mapping):
            if len(spec) != 1:
                raise ValueError(f'{field}: give one operator and value, e.g. {{"=~": "0|1"}}')
            ((op, spec),) = spec.items()
            if op not in OPS:
                raise ValueError(f"{field}: unknown operator {op!r}; use one of {', '.join(OPS)}")
            field = f"{field}.{op}"
        if not isinstance(spec, str):
            raise ValueError(f"{field}: a label value is a string, got {json.dumps(spec)[:40]}")
        plain(field, spec, MAX_NAME)
    parse_matchers(dict(match))  # a bad regex says so here


def parse_id(text: str) -> int | None:
    """A silence's id as written in a URL, or None when it cannot be one (not a whole number, or
    out of range)."""
    if not re.fullmatch(r"[0-9]{1,19}", text):
        return None
    number = int(text)
    return number if _storable(number) else None


def _storable(silence_id: int) -> bool:
    return 0 < silence_id <= MAX_ID


def add(
    db: sqlite3.Connection,
    rule: str,
    match: Mapping[str, Any],
    starts: float,
    ends: float,
    reason: str,
    author: str,
    now: float,
    longest: float = DEFAULT_MAX_SILENCE,
) -> Silence:
    check(rule, match, starts, ends, reason, longest=longest)
    with transaction(db):
        cursor = db.execute(
            "INSERT INTO silences (rule, match, starts, ends, reason, author, created) VALUES (?,?,?,?,?,?,?)",
            (rule, json.dumps(dict(match), sort_keys=True), starts, ends, reason.strip(), author, now),
        )
    assert cursor.lastrowid is not None
    return Silence(cursor.lastrowid, rule, dict(match), starts, ends, reason.strip(), author, now, None)


def listed(db: sqlite3.Connection, now: float, everything: bool = False) -> list[Silence]:
    """Active and future silences (``everything``: ended and expired ones too), newest first."""
    sql = "SELECT * FROM silences"
    params: tuple[Any, ...] = ()
    if not everything:
        sql += " WHERE expired IS NULL AND ends > ?"
        params = (now,)
    return [_silence(row) for row in db.execute(sql + " ORDER BY id DESC", params)]


def get(db: sqlite3.Connection, silence_id: int) -> Silence | None:
    """The silence ``silence_id``, whatever its state; None when there is none."""
    if not _storable(silence_id):
        return None
    row = db.execute("SELECT * FROM silences WHERE id = ?", (silence_id,)).fetchone()
    return None if row is None else _silence(row)


def end(db: sqlite3.Connection, silence_id: int, now: float) -> tuple[Silence | None, bool]:
    """End a silence now: (the silence, None when there is none; whether this call ended it). One
    conditional UPDATE, so of several at once (the API, the CLI, the page) exactly one ends it."""
    if not _storable(silence_id):
        return None, False
    with transaction(db):
        cursor = db.execute(
            "UPDATE silences SET expired = ? WHERE id = ? AND expired IS NULL AND ends > ?",
            (now, silence_id, now),
        )
        row = db.execute("SELECT * FROM silences WHERE id = ?", (silence_id,)).fetchone()
    return (None if row is None else _silence(row)), cursor.rowcount == 1


def silencing(db: sqlite3.Connection, rule: str, labels: Mapping[str, str], at: float) -> Silence | None:
    """The silence that holds back a firing of ``rule`` on ``labels`` at ``at``, if any."""
    rows = db.execute(
        "SELECT * FROM silences WHERE expired IS NULL AND starts <= ? AND ends > ? ORDER BY id", (at, at)
    )
    for row in rows:
        silence = _silence(row)
        if silence.takes(rule, labels):
            return silence
    return None


def _silence(row: sqlite3.Row) -> Silence:
    return Silence(
        row["id"],
        row["rule"],
        json.loads(row["match"]),
        row["starts"],
        row["ends"],
        row["reason"],
        row["author"],
        row["created"],
        row["expired"],
    )


# --- the HTTP API: /api/silences -------------------------------------------------------------

SILENCE_FIELDS = {"rule", "match", "for", "reason", "author"}


def api_routes(
    call: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]],
    token: Callable[[], str | None],
    longest: Callable[[], float] = lambda: DEFAULT_MAX_SILENCE,
) -> list[web.RouteDef]:
    """``GET /api/silences[?all=1]``, ``POST /api/silences``, ``DELETE /api/silences/{id}``.
    ``call`` runs a function on the store's writer thread; ``token`` gives the bearer token that
    writes need (None: none, the daemon listens on loopback only); ``longest`` the longest
    silence (``server.max_silence``)."""

    def refused(request: web.Request) -> web.Response | None:
        return api.refused(request, token())

    async def get(request: web.Request) -> web.Response:
        everything = request.query.get("all", "") in ("1", "true", "yes")
        found = await call(partial(listed, now=time.time(), everything=everything))
        return web.json_response({"silences": [asdict(item) for item in found]})

    async def post(request: web.Request) -> web.Response:
        denied = refused(request)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "the body is not JSON"}, status=400)
        try:
            rule, match, duration, reason, author = _fields(body)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        now = time.time()
        try:
            made = await call(
                partial(add, rule=rule, match=match, starts=now, ends=now + duration,
                        reason=reason, author=author, now=now, longest=longest())
            )  # fmt: skip
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.warning("silence %d added by %s for %s: %s", made.id, author, rule, reason)
        return web.json_response({"silence": asdict(made)}, status=201)

    async def delete(request: web.Request) -> web.Response:
        denied = refused(request)
        if denied is not None:
            return denied
        text = request.match_info["id"]
        silence_id = parse_id(text)
        if silence_id is None:
            return web.json_response(
                {"error": f"no silence {text[:40]!r}: an id is a whole number from 1 to {MAX_ID}"}, status=404
            )
        ended, now_ended = await call(partial(end, silence_id=silence_id, now=time.time()))
        if ended is None:
            return web.json_response({"error": f"no silence {silence_id}"}, status=404)
        if not now_ended:
            return web.json_response(
                {"error": f"silence {silence_id} had already ended", "silence": asdict(ended)}, status=404
            )
        log.warning("silence %d expired over the API", silence_id)
        return web.json_response({"silence": asdict(ended)})

    return [
        web.get("/api/silences", get),
        web.post("/api/silences", post),
        web.delete("/api/silences/{id}", delete),
    ]


def _fields(body: Any) -> tuple[str, dict[str, Any], float, str, str]:
    if not isinstance(body, dict):
        raise ValueError("the body is a JSON object: {rule, match, for, reason, author}")
    unknown = sorted(set(body) - SILENCE_FIELDS)
    if unknown:
        shown = ", ".join(name[:40] for name in unknown)
        raise ValueError(f"unknown field(s) {shown}; known: {', '.join(sorted(SILENCE_FIELDS))}")
    rule, reason, author = body.get("rule"), body.get("reason"), body.get("author", "api")
    if not isinstance(rule, str) or not isinstance(reason, str) or not isinstance(author, str):
        raise ValueError("rule, reason and author are strings; rule and reason are required")
    plain("author", author, MAX_NAME)
    match = body.get("match", {})
    if isinstance(match, list):
        if not all(isinstance(item, str) for item in match):
            raise ValueError('match: a mapping as in a rule, or a list such as ["instance=a:8000"]')
        for item in match:
            plain("match", item, 2 * MAX_NAME)
        match = parse_match(match)
    check_match(match)
    try:
        duration = parse_duration(body.get("for"))
    except ValueError as exc:
        raise ValueError(f"for: {exc}") from None
    if not math.isfinite(duration):  # digits enough to overflow a float
        raise ValueError(f"for: {str(body.get('for'))[:40]!r} is not a finite duration")
    return rule, match, duration, reason, author
