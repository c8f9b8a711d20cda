"""What the daemon's write APIs (silences, ladder steps) share: a bearer token, when the daemon has
one (it must, off loopback), and a JSON content type. A browser sends a request to another site
without asking first only when it is "simple" (a form's types, text/plain): no page elsewhere can
make a write that says application/json, so a daemon without a token on loopback is not written by
whatever site its operator's browser happens to show."""

from __future__ import annotations

import re

from aiohttp import web

from specguard.common.secrets import bearer_matches

JSON = "application/json"
# C0 and C1 control characters (NUL, escape, newline...) and the Unicode line separators: a name or
# reason holding one would print as something else in a table, a log line or the status page.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def plain(field: str, text: str, most: int) -> None:
    """Raises ValueError naming ``field`` when ``text`` is longer than ``most`` characters or
    holds a control character."""
    if len(text) > most:
        raise ValueError(f"{field}: at most {most} characters")
    found = _CONTROL.search(text)
    if found is not None:
        raise ValueError(
            f"{field}: holds a control character (U+{ord(found.group()):04X} at position {found.start()})"
        )


def refused(request: web.Request, secret: str | None) -> web.Response | None:
    """None when the request may write; else the 401 (no or wrong token) or the 415 (not
    application/json, a body or not) to answer."""
    if secret is not None and not bearer_matches(request.headers.get("Authorization", ""), secret):
        return web.json_response(
            {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
        )
    if request.content_type != JSON:
        given = request.headers.get("Content-Type", "")
        got = f"it is {given[:60]!r}" if given else "none was given"
        return web.json_response(
            {"error": f"send the request as Content-Type: {JSON} ({got}); every write to /api/ must"},
            status=415,
        )
    return None
