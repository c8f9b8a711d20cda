"""``specguard ladder`` over the daemon's HTTP API: the ``vllm_restart`` actions' rungs, and steps
by hand. The daemon makes the change (it restarts vLLM, verifies, rolls back, and keeps the
journal a restart of its own resumes), so a step asked for while another is under way is refused
rather than queued behind it.

``GET /api/ladder``: each ladder (its k, rungs, file, the change under way, its log).
``POST /api/ladder/{action}`` with ``{"to": "up" | "down" | K, "who": NAME}``: answers when the
change is over, 200 with ``{"ok", "detail"}``; 404 for an unknown action, 400 for a bad ``to``,
409 while a change is under way; 415 unless sent as application/json. Writes need the daemon's
token when it has one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from specguard.actions import Action
from specguard.actions.vllm_restart import VllmRestartAction
from specguard.dispatch import api
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

log = logging.getLogger("specguard.ladder")
MAX_WHO = 200


def ladders(actions: Mapping[str, Action]) -> dict[str, VllmRestartAction]:
    return {name: a for name, a in actions.items() if isinstance(a, VllmRestartAction)}


def api_routes(
    actions: Callable[[], Mapping[str, Action]], store: Store, token: Callable[[], str | None]
) -> list[web.RouteDef]:
    def refused(request: web.Request) -> web.Response | None:
        return api.refused(request, token())

    async def get(request: web.Request) -> web.Response:
        shown = [await a.show(StoreMemory(store, name)) for name, a in ladders(actions()).items()]
        return web.json_response({"ladders": shown})

    async def post(request: web.Request) -> web.Response:
        denied = refused(request)
        if denied is not None:
            return denied
        name = request.match_info["action"]
        action = ladders(actions()).get(name)
        if action is None:
            known = ", ".join(sorted(ladders(actions()))) or "none is configured"
            return web.json_response(
                {"error": f"no vllm_restart action {name!r} (known: {known})"}, status=404
            )
        try:
            body: Any = await request.json()
        except ValueError:
            return web.json_response({"error": 'the body is JSON: {"to": "up" | "down" | K}'}, status=400)
        to = body.get("to") if isinstance(body, dict) else None
        who = body.get("who", "api") if isinstance(body, dict) else "api"
        if not (to in ("up", "down") or (isinstance(to, int) and not isinstance(to, bool))) or not isinstance(
            who, str
        ):
            return web.json_response(
                {"error": 'to: "up", "down" or a rung (a number); who: a name'}, status=400
            )
        try:
            api.plain("who", who, MAX_WHO)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if action.busy:
            return web.json_response(
                {"error": f"{name}: a change is under way; try again when it is over"}, status=409
            )
        log.warning("%s: a step %s asked for by %s", name, to, who)
        outcome = await action.step(StoreMemory(store, name), to, who)
        return web.json_response({"ok": outcome.ok, "detail": outcome.detail})

    return [web.get("/api/ladder", get), web.post("/api/ladder/{action}", post)]
