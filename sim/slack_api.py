"""A Slack Web API on loopback, for the tests and the demo: the methods specguard's ``slack`` action calls
(``chat.postMessage``, ``chat.update``, ``chat.delete`` (a message the token posted; another's is
``cant_delete_message``, as a bot's token gets), ``conversations.history``, ``conversations.replies``, and the
file upload of ``files_upload_v2``: ``files.getUploadURLExternal``, a POST of the bytes to the upload
URL it hands out, ``files.completeUploadExternal``) and an incoming webhook, as Slack answers them
(``{"ok": ...}`` bodies, bearer tokens, message metadata, threads, files shared into a thread), with
faults to stage: 429 with ``Retry-After`` (a number, or any text: ``inf``, an HTTP date), 5xx, any
status, an ``ok: false`` error, a dropped connection, an answer slower than the client waits, a
call that is done but whose answer is lost, or answered with a body of one's choosing, or with a
huge body (streamed as it is sent, never held: declared by Content-Length or chunked)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

TOKEN = "xoxb-test-token"


@dataclass
class Fault:
    kind: str  # 429 | 500 | status | error | drop | slow | lose | answer | huge
    seconds: float = 0.0  # 429: Retry-After; slow: how long the answer takes
    retry_after: str | None = None  # 429: the Retry-After header as given (instead of seconds)
    status: int = 0  # status: the answer's status (with ``error`` as Slack's error)
    error: str = ""  # error: the ``error`` of an ``ok: false`` answer (200)
    answer: dict[str, Any] | None = None  # answer: the call is done, and answered with this
    size: int = 0  # huge: the call is done, and answered with a body of this many bytes
    chunked: bool = False  # huge: chunked, else a declared Content-Length
    # Only for this call (a method's name, "upload" for the upload URL, "webhook"); None: the next
    # call whatever it is. A fault for one call waits while other calls pass.
    method: str | None = None


@dataclass
class Upload:
    """A file as ``files.getUploadURLExternal`` announced it, its bytes once POSTed, and where
    ``files.completeUploadExternal`` shared it (None: not completed)."""

    id: str
    filename: str
    length: int
    data: bytes | None = None
    title: str | None = None
    channel: str | None = None
    thread_ts: str | None = None
    completed: bool = False


@dataclass
class SlackApi:
    url: str = ""  # the Web API's base_url, ending in a slash
    webhook_url: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)  # as stored, in order
    calls: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)  # (method, when, body)
    faults: list[Fault] = field(default_factory=list)  # applied to the next calls, one each
    webhook_posts: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[dict[str, Any]] = field(default_factory=list)  # by chat.delete, in order
    uploads: dict[str, Upload] = field(default_factory=dict)  # by file id, as announced
    # called with ("post" | "update", the message as stored) once a message is stored or edited
    listeners: list[Callable[[str, dict[str, Any]], None]] = field(default_factory=list)
    _clock: int = 0

    def tell(self, kind: str, stored: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener(kind, stored)

    def posted(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("via") == "api"]

    def shared(self) -> list[Upload]:
        """The files shared (``files.completeUploadExternal`` done), in order."""
        return [u for u in self.uploads.values() if u.completed]

    def fault(self, method: str) -> Fault | None:
        """The next staged fault that applies to a call of ``method``, taken off the list."""
        for index, fault in enumerate(self.faults):
            if fault.method is None or fault.method == method:
                return self.faults.pop(index)
        return None

    def _ts(self) -> str:
        self._clock += 1
        return f"{int(time.time())}.{self._clock:06d}"


async def _body(request: web.Request) -> dict[str, Any]:
    # a client may send a POST's arguments as its query string (slack-sdk does, for the files.* ones)
    query = dict(request.query)
    if request.content_type == "application/json":
        data = await request.json()
        return {**query, **data} if isinstance(data, dict) else query
    if request.method == "GET":
        return query
    return {**query, **(await request.post())}


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true")


def build(api: SlackApi) -> web.Application:
    async def method(request: web.Request) -> web.StreamResponse:
        name = request.match_info["method"]
        body = await _body(request)
        api.calls.append((name, time.time(), body))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        fault = api.fault(name)
        failed = await _failure(request, fault)
        if failed is not None:
            return failed
        answer = _answer(api, name, body, str(request.url.origin()))
        if fault is not None and fault.kind == "lose":  # done, but the answer never arrives
            return _hang_up(request)
        if fault is not None and fault.kind == "answer":  # done, and answered as staged
            return web.json_response(fault.answer)
        if fault is not None and fault.kind == "huge":
            return await _huge(request, fault)
        return web.json_response(answer)

    async def upload(request: web.Request) -> web.StreamResponse:
        """The upload URL: the file's bytes, as the raw body (slack-sdk's way) or a multipart
        form's ``file`` part; no token (the URL is the credential)."""
        file_id = request.match_info["file_id"]
        data = await _file_bytes(request)
        api.calls.append(("upload", time.time(), {"file_id": file_id, "length": len(data)}))
        fault = api.fault("upload")
        failed = await _failure(request, fault)
        if failed is not None:
            return failed
        announced = api.uploads.get(file_id)
        if announced is None or announced.completed:
            return web.Response(text="not found", status=404, content_type="text/plain")
        if len(data) != announced.length:
            return web.Response(text="length mismatch", status=400, content_type="text/plain")
        announced.data = data
        if fault is not None and fault.kind == "lose":
            return _hang_up(request)
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    async def webhook(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        api.webhook_posts.append(body)
        fault = api.fault("webhook")
        if fault is not None and fault.kind == "429":
            return web.Response(text="rate_limited", status=429, headers={"Retry-After": _retry_after(fault)})
        if fault is not None and fault.kind in ("500", "status"):  # as Slack: the error's name as text
            api.webhook_posts.pop()
            if fault.kind == "500":
                return web.Response(text="internal_error", status=500)
            return web.Response(text=fault.error, status=fault.status)
        api.messages.append({"via": "webhook", **body})
        if fault is not None and fault.kind == "huge":
            return await _huge(request, fault)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/api/{method}", method)
    app.router.add_post("/upload/v1/{file_id}", upload)
    app.router.add_post("/services/T000/B000/XXXX", webhook)
    return app


async def _failure(request: web.Request, fault: Fault | None) -> web.StreamResponse | None:
    """The answer a staged fault gives instead of doing the call (None: the call goes on; a
    ``slow`` fault has waited, a ``lose`` one hangs up after it)."""
    if fault is None:
        return None
    if fault.kind == "429":
        return web.json_response(
            {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": _retry_after(fault)}
        )
    if fault.kind == "500":
        return web.json_response({"ok": False, "error": "internal_error"}, status=500)
    if fault.kind == "status":
        return web.json_response({"ok": False, "error": fault.error}, status=fault.status)
    if fault.kind == "error":
        return web.json_response({"ok": False, "error": fault.error})
    if fault.kind == "drop":
        return _hang_up(request)
    if fault.kind == "slow":
        await asyncio.sleep(fault.seconds)
    return None


def _retry_after(fault: Fault) -> str:
    return fault.retry_after if fault.retry_after is not None else f"{fault.seconds:g}"


async def _huge(request: web.Request, fault: Fault) -> web.StreamResponse:
    """A 200 whose body is ``fault.size`` bytes (a JSON object that never closes), written a
    chunk at a time as the client reads, until it is all sent or the client hangs up."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    if fault.chunked:
        response.enable_chunked_encoding()
    else:
        response.content_length = fault.size
    await response.prepare(request)
    head = b'{"ok": true, "pad": "'
    chunk = b"x" * 65536
    try:
        await response.write(head)
        left = fault.size - len(head)
        while left > 0:
            await response.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        await response.write_eof()
    except (ConnectionError, RuntimeError):  # the client hung up: as it should, early
        pass
    return response


def _hang_up(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.close()
    return web.Response()


async def _file_bytes(request: web.Request) -> bytes:
    if request.content_type.startswith("multipart/"):
        async for part in await request.multipart():
            if isinstance(part, BodyPartReader) and part.name in ("file", "filename"):
                return bytes(await part.read())
        return b""
    return await request.read()


def _json_list(value: Any) -> list[Any]:
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return []
    return parsed if isinstance(parsed, list) else []


def _upload_answer(api: SlackApi, name: str, body: dict[str, Any], origin: str) -> dict[str, Any]:
    if name == "files.getUploadURLExternal":
        filename, length = body.get("filename"), str(body.get("length", ""))
        if not filename or not length.isdigit():
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{len(api.uploads) + 1:08d}"
        api.uploads[file_id] = Upload(file_id, str(filename), int(length))
        return {"ok": True, "upload_url": f"{origin}/upload/v1/{file_id}", "file_id": file_id}
    # files.completeUploadExternal
    wanted = _json_list(body.get("files"))
    if not wanted or not all(isinstance(f, dict) and f.get("id") for f in wanted):
        return {"ok": False, "error": "invalid_arguments"}
    found = [api.uploads.get(str(f["id"])) for f in wanted]
    uploads = [u for u in found if u is not None and u.data is not None and not u.completed]
    if len(uploads) != len(wanted):
        return {"ok": False, "error": "file_not_found"}
    channel, thread = body.get("channel_id") or None, body.get("thread_ts") or None
    if thread is not None and not any(
        m.get("ts") == thread and m.get("channel") == channel for m in api.messages
    ):
        return {"ok": False, "error": "invalid_thread_ts"}
    shown = []
    for upload, asked in zip(uploads, wanted, strict=True):
        upload.title = str(asked.get("title") or upload.filename)
        upload.channel, upload.thread_ts, upload.completed = channel, thread, True
        shown.append({"id": upload.id, "name": upload.filename, "title": upload.title, "size": upload.length})
    if channel is not None:
        stored = {
            "via": "api",
            "channel": channel,
            "ts": api._ts(),
            "text": body.get("initial_comment") or "",
            "blocks": None,
            "thread_ts": thread,
            "metadata": None,
            "edits": 0,
            "files": shown,
        }
        api.messages.append(stored)
        api.tell("post", stored)
    return {"ok": True, "files": shown}


def _answer(api: SlackApi, name: str, body: dict[str, Any], origin: str) -> dict[str, Any]:
    if name in ("files.getUploadURLExternal", "files.completeUploadExternal"):
        return _upload_answer(api, name, body, origin)
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
    if name == "chat.delete":  # the token's own messages only (a test may stage one with another "by")
        for index, stored in enumerate(api.messages):
            if stored.get("ts") == body.get("ts") and stored.get("channel") == body.get("channel"):
                if stored.get("via") != "api" or stored.get("by", TOKEN) != TOKEN:
                    return {"ok": False, "error": "cant_delete_message"}
                api.deleted.append(api.messages.pop(index))
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
                **({"files": m["files"]} if m.get("files") else {}),
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
