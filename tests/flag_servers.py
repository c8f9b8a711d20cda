"""Servers on loopback for the feature flag's dependencies, misbehaving as a test tells them: huge
answers streamed lazily, and a vLLM for the canary whose answers and counters the test writes.
Plus the reader's peak memory, to show that a huge answer was not taken in."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

HUGE = 800_000_000  # bytes: an answer no flag API or vLLM gives
_CHUNK = b"x" * (64 * 1024)  # written again and again: the huge answer is never held anywhere
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class HugeAnswer:
    """A handler answering ``HUGE`` bytes with ``status``, declared (Content-Length) or chunked.
    ``sent``: the bytes the connection took before the reader hung up."""

    def __init__(self, status: int = 200, declared: bool = True) -> None:
        self.status = status
        self.declared = declared
        self.sent = 0
        self.requests = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        response = web.StreamResponse(status=self.status, headers={"Content-Type": "application/json"})
        if self.declared:
            response.content_length = HUGE
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        written = 0
        try:
            while written < HUGE:
                chunk = _CHUNK if HUGE - written >= len(_CHUNK) else _CHUNK[: HUGE - written]
                await response.write(chunk)
                written += len(chunk)
                self.sent += len(chunk)
        except ConnectionError:  # the reader hung up: what it wanted to show
            pass
        return response


def _peak_kib() -> int:
    match = re.search(r"^VmHWM:\s+(\d+) kB", _STATUS.read_text(), re.M) if _STATUS.exists() else None
    if match is None:  # no /proc: the peak since the process started, in KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(match.group(1))


class PeakMemory:
    """How much this process's peak resident memory grew since ``start``. Where the peak can be
    reset (Linux), it is, so that what came before does not hide the growth; elsewhere an earlier,
    higher peak may hide some of it (never a growth that was not there)."""

    def start(self) -> None:
        with contextlib.suppress(OSError):
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the present resident size
        self.base = _peak_kib()

    def growth_mib(self) -> float:
        return (_peak_kib() - self.base) / 1024


def metrics_page(accepted: Any, drafts: Any, draft_tokens: Any) -> str:
    """A /metrics page with vLLM's speculative-decoding counters."""
    lines = []
    for name, value in (
        ("vllm:spec_decode_num_drafts", drafts),
        ("vllm:spec_decode_num_draft_tokens", draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", accepted),
    ):
        lines += [f"# TYPE {name} counter", f'{name}_total{{engine="0",model_name="m"}} {value}']
    return "\n".join(lines) + "\n"


class FakeVllm:
    """/v1/models, /v1/completions and /metrics. By default each completion generates 16 tokens
    in 5 drafts of 4 tokens, 16 of them accepted (acceptance 0.8); ``completion`` (a body) and
    ``pages`` (the /metrics pages, served in turn) replace what it answers."""

    def __init__(self) -> None:
        self.accepted = self.drafts = self.draft_tokens = 0
        self.completion: bytes | None = None
        self.pages: list[str] = []
        self.completions = 0

    def app(self, **extra: Callable[[web.Request], Any]) -> web.Application:
        """The server's routes, ``extra`` (path: handler) among them or in their stead."""
        app = web.Application()
        routes = {"/v1/models": self._models, "/v1/completions": self._complete, "/metrics": self._metrics}
        for path, handler in {**routes, **extra}.items():
            app.router.add_route(
                "*", path, handler if inspect.iscoroutinefunction(handler) else handler.__call__
            )
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def _complete(self, request: web.Request) -> web.Response:
        await request.read()
        self.completions += 1
        if self.completion is not None:
            return web.Response(body=self.completion, content_type="application/json")
        self.accepted, self.drafts, self.draft_tokens = (
            self.accepted + 16,
            self.drafts + 5,
            self.draft_tokens + 20,
        )
        return web.Response(
            text=json.dumps({"usage": {"completion_tokens": 16}}), content_type="application/json"
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        page = (
            self.pages.pop(0) if self.pages else metrics_page(self.accepted, self.drafts, self.draft_tokens)
        )
        return web.Response(text=page, content_type="text/plain")
