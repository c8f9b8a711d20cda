"""What the daemon's write APIs (silences, ladder steps) share: a bearer token, when the daemon has
one (it must, off loopback)."""

from __future__ import annotations

from aiohttp import web

from common.secrets import bearer_matches


def refused(request: web.Request, secret: str | None) -> web.Response | None:
    """None when the request may write; else the 401 to answer."""
    if secret is None or bearer_matches(request.headers.get("Authorization", ""), secret):
        return None
    return web.json_response(
        {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
    )
