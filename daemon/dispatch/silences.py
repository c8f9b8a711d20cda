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
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from aiohttp import web

from daemon.dispatch import api
from daemon.store import transaction
from rules.durations import parse_duration
from rules.matchers import all_match, parse_matchers

log = logging.getLogger("specguard.silences")

_MATCH = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*)$")
MAX_REASON = 500


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


def check(rule: str, match: Mapping[str, Any], starts: float, ends: float, reason: str) -> None:
    """Raises ValueError with what is wrong with a silence about to be added."""
    if not rule.strip():
        raise ValueError("rule: name the rule (a glob such as acceptance_* is fine)")
    parse_matchers(dict(match))
    if not ends > starts:
        raise ValueError("the silence must end after it starts (give a positive duration)")
    if not reason.strip():
        raise ValueError("reason: say why, for whoever is on call next")
    if len(reason) > MAX_REASON:
        raise ValueError(f"reason: at most {MAX_REASON} characters")


def add(
    db: sqlite3.Connection,
    rule: str,
    match: Mapping[str, Any],
    starts: float,
    ends: float,
    reason: str,
    author: str,
    now: float,
) -> Silence:
    check(rule, match, starts, ends, reason)
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
    row = db.execute("SELECT * FROM silences WHERE id = ?", (silence_id,)).fetchone()
    return None if row is None else _silence(row)


def expire(db: sqlite3.Connection, silence_id: int, now: float) -> Silence | None:
    """End a silence now; None when there is no such silence. Ending an ended one changes nothing."""
    with transaction(db):
        row = db.execute("SELECT * FROM silences WHERE id = ?", (silence_id,)).fetchone()
        if row is None:
            return None
        if row["expired"] is None and row["ends"] > now:
            db.execute("UPDATE silences SET expired = ? WHERE id = ?", (now, silence_id))
    return _silence(db.execute("SELECT * FROM silences WHERE id = ?", (silence_id,)).fetchone())


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
    call: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]], token: Callable[[], str | None]
) -> list[web.RouteDef]:
    """``GET /api/silences[?all=1]``, ``POST /api/silences``, ``DELETE /api/silences/{id}``.
    ``call`` runs a function on the store's writer thread; ``token`` gives the bearer token that
    writes need (None: none, the daemon listens on loopback only)."""

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
        if request.content_type != "application/json":
            return web.json_response({"error": "send the silence as application/json"}, status=415)
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
                        reason=reason, author=author, now=now)
            )  # fmt: skip
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.warning("silence %d added by %s for %s: %s", made.id, author, rule, reason)
        return web.json_response({"silence": asdict(made)}, status=201)

    async def delete(request: web.Request) -> web.Response:
        denied = refused(request)
        if denied is not None:
            return denied
        try:
            silence_id = int(request.match_info["id"])
        except ValueError:
            return web.json_response({"error": "a silence id is a number"}, status=400)
        ended = await call(partial(expire, silence_id=silence_id, now=time.time()))
        if ended is None:
            return web.json_response({"error": f"no silence {silence_id}"}, status=404)
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
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(SILENCE_FIELDS))}")
    rule, reason, author = body.get("rule"), body.get("reason"), body.get("author", "api")
    if not isinstance(rule, str) or not isinstance(reason, str) or not isinstance(author, str):
        raise ValueError("rule, reason and author are strings; rule and reason are required")
    match = body.get("match", {})
    if isinstance(match, list):
        if not all(isinstance(item, str) for item in match):
            raise ValueError('match: a mapping as in a rule, or a list such as ["instance=a:8000"]')
        match = parse_match(match)
    elif not isinstance(match, dict):
        raise ValueError('match: a mapping as in a rule, or a list such as ["instance=a:8000"]')
    try:
        duration = parse_duration(body.get("for"))
    except ValueError as exc:
        raise ValueError(f"for: {exc}") from None
    return rule, match, duration, reason, author
