"""A Slack Web API on loopback, for the tests and the demo: the methods specguard's ``slack`` action calls
(``chat.postMessage``, ``chat.update``, ``conversations.history``, ``conversations.replies``) and an
incoming webhook, as Slack answers them (``{"ok": ...}`` bodies, bearer tokens, message metadata,
threads), with faults to stage: 429 with ``Retry-After``, 5xx, a dropped connection, an answer slower
than the client waits, and a post that is stored but whose answer is lost."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "xoxb-test-token"


@dataclass
class Fault:
    kind: str  # 429 | 500 | drop | slow | lose
    seconds: float = 0.0  # 429: Retry-After; slow: how long the answer takes


@dataclass
class SlackApi:
    url: str = ""  # the Web API's base_url, ending in a slash
    webhook_url: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)  # as stored, in order
    calls: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)  # (method, when, body)
    faults: list[Fault] = field(default_factory=list)  # applied to the next calls, one each
    webhook_posts: list[dict[str, Any]] = field(default_factory=list)
    # called with ("post" | "update", the message as stored) once a message is stored or edited
    listeners: list[Callable[[str, dict[str, Any]], None]] = field(default_factory=list)
    _clock: int = 0

    def tell(self, kind: str, stored: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener(kind, stored)

    def posted(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("via") == "api"]

    def _ts(self) -> str:
        self._clock += 1
        return f"{int(time.time())}.{self._clock:06d}"


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        data = await request.json()
        return dict(data) if isinstance(data, dict) else {}
    if request.method == "GET":
        return dict(request.query)
    return dict(await request.post())


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true")


def build(api: SlackApi) -> web.Application:
    async def method(request: web.Request) -> web.StreamResponse:
        name = request.match_info["method"]
        body = await _body(request)
        api.calls.append((name, time.time(), body))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        fault = api.faults.pop(0) if api.faults else None
        if fault is not None and fault.kind == "429":
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": f"{fault.seconds:g}"},
            )
        if fault is not None and fault.kind == "500":
            return web.json_response({"ok": False, "error": "internal_error"}, status=500)
        if fault is not None and fault.kind == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if fault is not None and fault.kind == "slow":
            await asyncio.sleep(fault.seconds)
        answer = _answer(api, name, body)
        if fault is not None and fault.kind == "lose":  # done, but the answer never arrives
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.json_response(answer)

    async def webhook(request: web.Request) -> web.Response:
        body = await request.json()
        api.webhook_posts.append(body)
        fault = api.faults.pop(0) if api.faults else None
        if fault is not None and fault.kind == "429":
            return web.Response(
                text="rate_limited", status=429, headers={"Retry-After": f"{fault.seconds:g}"}
            )
        if fault is not None and fault.kind == "500":
            api.webhook_posts.pop()
            return web.Response(text="internal_error", status=500)
        api.messages.append({"via": "webhook", **body})
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/api/{method}", method)
    app.router.add_post("/services/T000/B000/XXXX", webhook)
    return app


def _answer(api: SlackApi, name: str, body: dict[str, Any]) -> dict[str, Any]:
    if name == "chat.postMessage":
        blocks = body.get("blocks")
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        stored = {
            "via": "api",
            "channel": body["channel"],
            "ts": api._ts(),
            "text": body.get("text"),
            "blocks": blocks,
            "thread_ts": body.get("thread_ts"),
            "metadata": body.get("metadata"),
            "edits": 0,
        }
        api.messages.append(stored)
        api.tell("post", stored)
        return {"ok": True, "channel": stored["channel"], "ts": stored["ts"], "message": stored}
    if name == "chat.update":
        for stored in api.messages:
            if stored.get("ts") == body.get("ts") and stored.get("channel") == body.get("channel"):
                blocks = body.get("blocks")
                stored["text"] = body.get("text")
                stored["blocks"] = json.loads(blocks) if isinstance(blocks, str) else blocks
                stored["edits"] += 1
                api.tell("update", stored)
                return {"ok": True, "channel": stored["channel"], "ts": stored["ts"]}
        return {"ok": False, "error": "message_not_found"}
    if name in ("conversations.history", "conversations.replies"):
        channel, oldest = body.get("channel"), float(body.get("oldest", 0))
        found = [m for m in api.messages if m.get("channel") == channel and float(m["ts"]) >= oldest]
        if name == "conversations.history":
            found = [m for m in found if not m.get("thread_ts")]
        else:
            found = [m for m in found if m["ts"] == body.get("ts") or m.get("thread_ts") == body.get("ts")]
        with_meta = _truthy(body.get("include_all_metadata"))
        shown = [
            {
                "ts": m["ts"],
                "text": m["text"],
                **({"metadata": m["metadata"]} if with_meta and m["metadata"] else {}),
            }
            for m in reversed(found)
        ]
        return {"ok": True, "messages": shown, "has_more": False}
    return {"ok": False, "error": "unknown_method"}


@asynccontextmanager
async def running() -> AsyncIterator[SlackApi]:
    api = SlackApi()
    runner = web.AppRunner(build(api), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api.url = f"http://127.0.0.1:{port}/api/"
    api.webhook_url = f"http://127.0.0.1:{port}/services/T000/B000/XXXX"
    try:
        yield api
    finally:
        await runner.cleanup()
