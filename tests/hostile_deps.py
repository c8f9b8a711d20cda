"""A hostile *dependency*: one HTTP server on 127.0.0.1 that plays the flag API, the Slack Web API
and a vLLM server (the canary's ``/v1/models``, ``/v1/completions`` and ``/metrics``, the restart's
``/health`` and ``/version``), and misbehaves on demand. It runs on its own event loop in a thread,
as ``tests.hostile`` does for scrape targets, so a test can keep it up while a ``specguard run`` in
its own process (or a daemon in the test's loop) talks to it.

Paths (what a config points at):

- ``/flag`` (and anything under it): the flag API. A PUT, POST or PATCH stores its JSON body under
  its path and answers 200 with it; a GET answers what was stored there last (404 before any write).
- ``/slack/api/<method>``: the Slack Web API (give ``base_url: <url>/slack/api/``). Healthy, it
  answers ``chat.postMessage`` with ``{"ok": true, "channel", "ts"}`` (the message kept, its
  metadata with it), ``chat.update``, and ``conversations.history`` / ``conversations.replies``
  (with metadata), as Slack does; any other method ``{"ok": false, "error": "unknown_method"}``.
- ``/vllm/...``: a vLLM server (give the canary ``url: <url>/vllm``). Healthy: ``/v1/models`` lists
  one model, each ``/v1/completions`` adds 40 draft tokens (10 drafts) of which 32 are accepted
  (acceptance 0.8) and answers 64 completion tokens, ``/metrics`` shows those counters,
  ``/health`` answers 200 and ``/version`` ``{"version": "0.32.0"}``.

Modes (``MODES``). A mode is chosen per path at run time (``set("/flag", "hang")``: that path and
everything under it; the longest prefix set wins) or in the URL itself (``url("/flag", "hang")`` is
``/hang/flag``: the mode's name as the first segment, the rest the path it plays). ``heal()`` makes
every path answer correctly whatever was set or asked for in the URL; ``harm()`` undoes it (what was
set applies again).

- ``healthy``: as above.
- ``hang``: reads the request, never answers.
- ``slowloris``: 200 with headers at once, then one space (JSON's leading white space) every
  ``trickle`` seconds (2 s), never ending.
- ``endless``: 200, chunked, an endless body as fast as the client reads.
- ``huge``: 200 with ``Content-Length`` 800 MB, and that many bytes sent as fast as the client reads.
- ``huge500``: the same with status 500 (an error page nobody should read whole).
- ``error500``: 500 with a short body (an error worth retrying).
- ``redirect_loop``: 307 to the same path again, forever (``?hop=N`` counts the hops).
- ``cross_host``: 307 to the same path on another loopback port (``elsewhere_port``), which answers
  200 ``{}`` to anything and counts what reached it in ``elsewhere``.
- ``garbage``: 200, ``application/json``, a body that is not JSON.
- ``reset``: 200 announcing 1000 bytes, a few sent, then the connection reset.
- ``retry_inf`` / ``retry_huge`` / ``retry_date`` / ``retry_nan``: 429 (with Slack's
  ``{"ok": false, "error": "ratelimited"}``) and ``Retry-After`` ``inf``, ``999999999``, an HTTP
  date a year ahead, or ``nan``.
- ``invalid_auth`` / ``channel_not_found`` / ``not_in_channel`` / ``account_inactive``: 200 with
  Slack's ``{"ok": false, "error": <the mode>}``.
- ``ok_without_ts``: 200 ``{"ok": true}`` (no ``channel``, no ``ts``).
- ``canary_absurd``: a vLLM whose accepted tokens grow 10,000 times faster than its draft tokens.
- ``canary_nan``: a vLLM whose ``/metrics`` counters read ``NaN``.
- ``canary_backwards``: a vLLM whose counters go down at every read of ``/metrics``.
- ``canary_overflow``: a vLLM whose completions answer ``"completion_tokens": 1e999``.
  (The four canary modes play a vLLM on every path; ``/v1/models`` answers as healthy.)

Counting: ``requests`` counts every request by ``"METHOD /path"`` (the path as played, without a
mode segment); ``served`` counts those answered correctly (healthy); ``count(path, method)`` and
``served_count(path, method)`` read them. ``flag_writes`` keeps each healthy write (path, body),
``messages`` each Slack message posted: enough to assert that something completed exactly once.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

HUGE = 800 * 1024 * 1024
CHUNK = 64 * 1024
MODEL = "hostile-model"
SLACK_ERRORS = ("invalid_auth", "channel_not_found", "not_in_channel", "account_inactive")
CANARY_MODES = ("canary_absurd", "canary_nan", "canary_backwards", "canary_overflow")
MODES = (
    "healthy",
    "hang",
    "slowloris",
    "endless",
    "huge",
    "huge500",
    "error500",
    "redirect_loop",
    "cross_host",
    "garbage",
    "reset",
    "retry_inf",
    "retry_huge",
    "retry_date",
    "retry_nan",
    *SLACK_ERRORS,
    "ok_without_ts",
    *CANARY_MODES,
)

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


class HostileDeps:
    """The server; ``start()`` it (or use it as a context manager), then point configs at ``url()``."""

    def __init__(self, trickle: float = 2.0) -> None:
        self.port = 0
        self.elsewhere_port = 0
        self.trickle = trickle
        self.healthy = False  # every path answers correctly, whatever mode
        self.modes: dict[str, str] = {}  # path prefix -> mode
        self.requests: Counter[str] = Counter()
        self.served: Counter[str] = Counter()
        self.elsewhere: Counter[str] = Counter()
        self.flag_writes: list[tuple[str, Any]] = []
        self.flags: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] = []
        self.drafted = 0.0
        self.accepted = 0.0
        self.drafts = 0.0
        self._ts = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runners: list[web.AppRunner] = []

    # --- what a test calls -----------------------------------------------------------------------

    def url(self, path: str = "", mode: str | None = None) -> str:
        if mode is not None and mode not in MODES:
            raise ValueError(f"no mode {mode!r}")
        return f"http://127.0.0.1:{self.port}" + (f"/{mode}" if mode else "") + path

    def set(self, prefix: str, mode: str) -> None:
        """``prefix`` (a path, and everything under it) answers in ``mode`` from now on."""
        if mode not in MODES:
            raise ValueError(f"no mode {mode!r}")
        self.modes[prefix] = mode

    def heal(self) -> None:
        self.healthy = True

    def harm(self) -> None:
        self.healthy = False

    def count(self, path: str, method: str | None = None) -> int:
        return _count(self.requests, path, method)

    def served_count(self, path: str, method: str | None = None) -> int:
        return _count(self.served, path, method)

    def start(self) -> HostileDeps:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the hostile dependency server did not start")
        return self

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self._runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> HostileDeps:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- serving ---------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._ready.set()
        self._loop.run_forever()
        tasks = asyncio.all_tasks(self._loop)  # handlers still hanging or trickling: end them
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        elsewhere = web.Application()
        elsewhere.router.add_route("*", "/{tail:.*}", self._elsewhere)
        for application in (app, elsewhere):
            runner = web.AppRunner(application, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runners.append(runner)
        self.port = int(self._runners[0].addresses[0][1])
        self.elsewhere_port = int(self._runners[1].addresses[0][1])

    def _mode_of(self, path: str) -> tuple[str, str]:
        """(the path as played, its mode) of a request's path."""
        first, _, rest = path.lstrip("/").partition("/")
        mode: str | None = None
        if first in MODES:
            mode, path = first, "/" + rest
        if mode is None:
            prefixes = [p for p in self.modes if path == p or path.startswith(p.rstrip("/") + "/")]
            mode = self.modes[max(prefixes, key=len)] if prefixes else "healthy"
        return path, "healthy" if self.healthy else mode

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path, mode = self._mode_of(request.path)
        key = f"{request.method} {path}"
        self.requests[key] += 1
        body = await request.read()
        if mode == "healthy" or (mode in CANARY_MODES and not path.startswith("/vllm")):
            response = await self._healthy(request, path, body)
            if response.status < 400:
                self.served[key] += 1
            return response
        try:
            return await _HOSTILE[mode](self, request, path)
        except ConnectionError:  # the client gave up (as it should): nothing more to send
            return web.Response(status=499)

    async def _elsewhere(self, request: web.Request) -> web.Response:
        self.elsewhere[f"{request.method} {request.path}"] += 1
        return web.json_response({})

    # --- healthy answers -------------------------------------------------------------------------

    async def _healthy(self, request: web.Request, path: str, body: bytes) -> web.Response:
        if path.startswith("/slack/api/"):
            return web.json_response(self._slack(path.removeprefix("/slack/api/"), request, body))
        if path.startswith("/vllm"):
            return self._vllm(path.removeprefix("/vllm"), "healthy")
        if request.method in ("PUT", "POST", "PATCH"):
            try:
                value = json.loads(body or b"null")
            except ValueError:
                return web.json_response({"error": "not JSON"}, status=400)
            self.flags[path] = value
            self.flag_writes.append((path, value))
            return web.json_response(value)
        if path in self.flags:
            return web.json_response(self.flags[path])
        return web.json_response({"error": "no such flag"}, status=404)

    def _slack(self, method: str, request: web.Request, body: bytes) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                data = dict(_form(body.decode("utf-8", "replace")))
            if isinstance(data, dict):
                args.update(data)
        if method == "chat.postMessage":
            metadata = args.get("metadata")
            stored = {
                "channel": args.get("channel"),
                "ts": f"{int(time.time())}.{next(self._ts):06d}",
                "text": args.get("text"),
                "thread_ts": args.get("thread_ts"),
                "metadata": json.loads(metadata) if isinstance(metadata, str) else metadata,
            }
            self.messages.append(stored)
            return {"ok": True, "channel": stored["channel"], "ts": stored["ts"]}
        if method == "chat.update":
            for stored in self.messages:
                if stored["ts"] == args.get("ts") and stored["channel"] == args.get("channel"):
                    stored["text"] = args.get("text")
                    return {"ok": True, "channel": stored["channel"], "ts": stored["ts"]}
            return {"ok": False, "error": "message_not_found"}
        if method in ("conversations.history", "conversations.replies"):
            oldest = float(args.get("oldest") or 0)
            found = [
                m
                for m in self.messages
                if m["channel"] == args.get("channel") and float(m["ts"]) >= oldest
                and (not m["thread_ts"] if method == "conversations.history"
                     else args.get("ts") in (m["ts"], m["thread_ts"]))
            ]  # fmt: skip
            shown = [{"ts": m["ts"], "text": m["text"], "metadata": m["metadata"]} for m in reversed(found)]
            return {"ok": True, "messages": shown, "has_more": False}
        return {"ok": False, "error": "unknown_method"}

    def _vllm(self, path: str, mode: str) -> web.Response:
        if path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if path == "/v1/completions":
            if mode == "canary_overflow":
                text = '{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1e999}}'
                return web.Response(text=text, content_type="application/json")
            self.drafts += 10
            self.drafted += 40
            self.accepted += 32 if mode != "canary_absurd" else 40 * 10_000
            return web.json_response({"choices": [{"text": "ok " * 64}], "usage": {"completion_tokens": 64}})
        if path == "/metrics":
            accepted, drafted, drafts = self.accepted, self.drafted, self.drafts
            if mode == "canary_backwards":
                self.accepted, self.drafted, self.drafts = accepted / 2, drafted / 2, drafts / 2
            shown = (
                ("NaN", "NaN", "NaN")
                if mode == "canary_nan"
                else (repr(accepted), repr(drafted), repr(drafts))
            )
            return web.Response(text=_metrics(*shown), content_type="text/plain")
        if path == "/health":
            return web.Response(text="")
        if path == "/version":
            return web.json_response({"version": "0.32.0"})
        return web.json_response({"error": "not found"}, status=404)


def _count(counter: Counter[str], path: str, method: str | None) -> int:
    return sum(
        n
        for key, n in counter.items()
        if key.split(" ", 1)[1] == path and method in (None, key.split(" ")[0])
    )


def _form(text: str) -> list[tuple[str, str]]:
    return parse_qsl(text, keep_blank_values=True)


def _metrics(accepted: str, drafted: str, drafts: str) -> str:
    labels = f'{{engine="0",model_name="{MODEL}"}}'
    return (
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f"vllm:spec_decode_num_accepted_tokens_total{labels} {accepted}\n"
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f"vllm:spec_decode_num_draft_tokens_total{labels} {drafted}\n"
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f"vllm:spec_decode_num_drafts_total{labels} {drafts}\n"
    )


# --- hostile answers ----------------------------------------------------------------------------


async def _hang(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    await asyncio.sleep(3600)
    return web.Response(text="")


async def _slowloris(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    while True:
        await response.write(b" ")
        await asyncio.sleep(server.trickle)


async def _endless(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    chunk = b" " * CHUNK
    while True:
        await response.write(chunk)


def _huge(status: int) -> Handler:
    async def handler(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
        response = web.StreamResponse(
            status=status, headers={"Content-Type": "application/json", "Content-Length": str(HUGE)}
        )
        await response.prepare(request)
        chunk = b" " * CHUNK
        for _ in range(HUGE // CHUNK):
            await response.write(chunk)
        return response

    return handler


async def _error500(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    return web.json_response({"ok": False, "error": "internal_error"}, status=500)


async def _redirect_loop(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    hop = int(request.query.get("hop", "0")) + 1
    return web.Response(status=307, headers={"Location": f"{request.path}?hop={hop}"})


async def _cross_host(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    return web.Response(status=307, headers={"Location": f"http://127.0.0.1:{server.elsewhere_port}{path}"})


async def _garbage(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    return web.Response(body=b'{"ok": tru\x00\xff\xfe lorem', content_type="application/json")


async def _reset(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "1000"})
    await response.prepare(request)
    await response.write(b'{"ok": true, "cha')
    transport = request.transport
    if transport is not None:
        transport.abort()
    return response


def _retry(value: Callable[[], str]) -> Handler:
    async def handler(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
        return web.json_response(
            {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": value()}
        )

    return handler


def _slack_error(error: str) -> Handler:
    async def handler(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
        return web.json_response({"ok": False, "error": error})

    return handler


async def _ok_without_ts(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
    return web.json_response({"ok": True})


def _canary(mode: str) -> Handler:
    async def handler(server: HostileDeps, request: web.Request, path: str) -> web.StreamResponse:
        return server._vllm(path.removeprefix("/vllm"), mode)

    return handler


_HOSTILE: dict[str, Handler] = {
    "hang": _hang,
    "slowloris": _slowloris,
    "endless": _endless,
    "huge": _huge(200),
    "huge500": _huge(500),
    "error500": _error500,
    "redirect_loop": _redirect_loop,
    "cross_host": _cross_host,
    "garbage": _garbage,
    "reset": _reset,
    "retry_inf": _retry(lambda: "inf"),
    "retry_huge": _retry(lambda: "999999999"),
    "retry_date": _retry(lambda: email.utils.formatdate(time.time() + 365 * 86400, usegmt=True)),
    "retry_nan": _retry(lambda: "nan"),
    **{error: _slack_error(error) for error in SLACK_ERRORS},
    "ok_without_ts": _ok_without_ts,
    **{mode: _canary(mode) for mode in CANARY_MODES},
}
assert set(_HOSTILE) | {"healthy"} == set(MODES)
