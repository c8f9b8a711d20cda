"""A hostile scrape target: one HTTP server, one misbehaviour per path.

Runs on its own event loop in a thread, so a test can keep it up across a whole module while a
`specguard run` in its own process scrapes it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

CAPTURE = (Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-metrics-self-draft.prom").read_text()
FIFTY_MB = 50 * 1024 * 1024


class _Negative:
    """A page whose accepted-token counter runs below zero and further down at every scrape, and
    whose running-requests gauge is -5: values no healthy vLLM exports."""

    def __init__(self) -> None:
        self.scrapes = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        text = re.sub(
            r"^(vllm:spec_decode_num_accepted_tokens_total\{[^}]*\}) \S+$",
            rf"\1 {-6550.0 - 30 * self.scrapes}",
            CAPTURE,
            flags=re.M,
        )
        text = re.sub(
            r"^(vllm:spec_decode_num_draft_tokens_total\{[^}]*\}) \S+$",
            rf"\1 {10000.0 + 50 * self.scrapes}",
            text,
            flags=re.M,
        )
        text = re.sub(r"^(vllm:num_requests_running\{[^}]*\}) \S+$", r"\1 -5.0", text, flags=re.M)
        return web.Response(text=text, content_type="text/plain")


def _without_inf_buckets() -> str:
    return "\n".join(line for line in CAPTURE.splitlines() if 'le="+Inf"' not in line) + "\n"


async def _trickle(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    for char in CAPTURE:
        await response.write(char.encode())
        await asyncio.sleep(1.0)
    return response


async def _endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    line = b'python_gc_objects_collected_total{generation="0"} 1.0\n' * 1000
    while True:
        await response.write(line)


async def _never(request: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    return web.Response(text="")


def _fixed(
    body: bytes, status: int = 200, content_type: str = "text/plain"
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, status=status, content_type=content_type)

    return handler


# mode -> (handler, what /api/status must say of the target: "down" with a reason containing the
# text, or "up" when the page parses but its values cannot be believed)
MODES: dict[str, tuple[Callable[[web.Request], Awaitable[web.StreamResponse]], str, str]] = {
    "garbage": (_fixed(b"\x8f\x00\x13 lorem ipsum\n\x00\x00"), "down", "not UTF-8 text"),
    "utf16": (_fixed(CAPTURE.encode("utf-16")), "down", "not UTF-8 text"),
    "html": (_fixed(b"<html><body>Login</body></html>", content_type="text/html"), "down", "HTML"),
    "http500": (_fixed(b"engine dead", status=500), "down", "HTTP 500"),
    "negative": (_Negative().handle, "up", ""),
    "no-inf-bucket": (_fixed(_without_inf_buckets().encode()), "up", ""),
    "never-answers": (_never, "down", "no page within"),
    "trickle": (_trickle, "down", "no page within"),
    "50mb": (_fixed(b"# " + b"x" * FIFTY_MB + b"\n"), "down", "over the"),
    "endless": (_endless, "down", "over the"),
}


class HostileServer:
    """Serves every mode at ``/<mode>/metrics`` on 127.0.0.1, from a thread of its own."""

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/metrics"

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the hostile server did not start")

    def stop(self) -> None:
        async def cleanup() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._ready.set()
        self._loop.run_forever()
        tasks = asyncio.all_tasks(self._loop)  # handlers still trickling or waiting: end them
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self) -> None:
        app = web.Application()
        for mode, (handler, _, _) in MODES.items():
            app.router.add_get(f"/{mode}/metrics", handler)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
