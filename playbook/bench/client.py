"""One streamed request to vLLM's OpenAI-compatible API, timed as a client sees it.

Token counts come from the server's ``usage``, never from counting chunks: with speculative
decoding one chunk carries every token a step accepted (up to k + 1), so counting chunks would
undercount by the mean acceptance length. ``stream_options.continuous_usage_stats`` makes vLLM put
the running count in every chunk, which gives the tokens of each chunk too (for the token-weighted
inter-token latency).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

Api = Literal["completions", "chat"]

# Why a request did not count: connect (refused, DNS), timeout, http_4xx, http_5xx, cut (the stream
# ended before its usage), bad_stream (not the OpenAI stream format).
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "cut", "bad_stream")

# The response headers specguard's router labels each answer with.
ROUTE_CLASS = "X-Specguard-Class"
ROUTE_POOL = "X-Specguard-Pool"


@dataclass
class Result:
    klass: str
    started: float  # time.perf_counter() when the request was sent
    ok: bool = False
    error_kind: str = ""
    error: str = ""
    response_id: str = ""
    ttft: float | None = None  # seconds to the first chunk with output (text, or tokens counted)
    e2e: float | None = None  # seconds to the end of the stream
    prompt_tokens: int = 0
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # seconds between chunks with output, after the first
    gap_tokens: list[int] = field(default_factory=list)  # tokens each of those chunks carried (usage)
    # What specguard's router said of the request (its X-Specguard-Class and X-Specguard-Pool
    # response headers): empty when the answer did not come through the router.
    route_class: str = ""
    route_pool: str = ""

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - TTFT) / (tokens - 1)."""
        if not self.ok or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def fail(self, kind: str, why: str) -> Result:
        self.ok, self.error_kind, self.error = False, kind, why[:300]
        return self


def body(
    api: Api, model: str, prompt: str, max_tokens: int, temperature: float, seed: int | None
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": True,  # vLLM's: every request makes max_tokens, so runs compare
    }
    # A seed only where sampling is random: vLLM gives a seeded request a generator of its own, which
    # costs decode time (measured: TPOT 9 % higher on the real server at temperature 0)
    if seed is not None and temperature > 0:
        request["seed"] = seed
    if api == "chat":
        request["messages"] = [{"role": "user", "content": prompt}]
    else:
        request["prompt"] = prompt
    return request


def _text(api: Api, choice: dict[str, Any]) -> str:
    if api == "chat":
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


async def send(
    session: aiohttp.ClientSession, url: str, api: Api, request: dict[str, Any], klass: str, timeout: float
) -> Result:
    """Send one streamed request; the result says what was measured, or why it failed."""
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    result = Result(klass, time.perf_counter())
    try:
        async with asyncio.timeout(timeout), session.post(url + path, json=request) as answer:
            result.route_class = answer.headers.get(ROUTE_CLASS, "")
            result.route_pool = answer.headers.get(ROUTE_POOL, "")
            if answer.status != 200:
                text = (await answer.text())[:300]
                kind = "http_4xx" if answer.status < 500 else "http_5xx"
                return result.fail(kind, f"HTTP {answer.status}: {_error_message(text)}")
            return await _read(answer, api, result)
    except TimeoutError:
        return result.fail("timeout", f"no complete answer within {timeout:g}s")
    except aiohttp.ClientConnectorError as exc:
        return result.fail("connect", f"cannot connect: {exc.os_error.strerror or exc}")
    except aiohttp.ClientPayloadError as exc:
        return result.fail("cut", f"the stream was cut: {exc}")
    except aiohttp.ServerDisconnectedError:
        return result.fail("cut", "the server closed the connection mid-stream")
    except aiohttp.ClientError as exc:
        return result.fail("connect", f"{type(exc).__name__}: {exc}")


async def _read(answer: aiohttp.ClientResponse, api: Api, result: Result) -> Result:
    last_text_at: float | None = None
    counted = 0  # completion tokens so far, from the running usage
    pending = 0  # tokens of chunks with no text yet to attribute
    done = False
    async for raw in answer.content:
        now = time.perf_counter()
        line = raw.decode("utf-8", "replace").strip()
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data:"):
            return result.fail("bad_stream", f"not a server-sent event: {line[:80]!r}")
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            return result.fail("bad_stream", f"a chunk is not JSON: {data[:80]!r}")
        if not isinstance(chunk, dict):
            return result.fail("bad_stream", "a chunk is not a JSON object")
        if "error" in chunk and not chunk.get("choices"):
            return result.fail("http_5xx", f"error in the stream: {_error_message(json.dumps(chunk))}")
        result.response_id = result.response_id or str(chunk.get("id") or "")
        usage = chunk.get("usage")
        tokens = 0
        if isinstance(usage, dict):
            total = int(usage.get("completion_tokens") or 0)
            tokens, counted = total - counted, total
            result.output_tokens = total
            result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        choices = chunk.get("choices") or []
        text = "".join(_text(api, c) for c in choices if isinstance(c, dict))
        # Output: text, or tokens the running usage counted (tokens may decode to no text yet:
        # part of a multi-byte character, or a special token)
        if not choices or not (text or tokens > 0):
            pending += tokens
            continue
        if result.ttft is None:
            result.ttft = now - result.started
        elif last_text_at is not None:
            result.gaps.append(now - last_text_at)
            result.gap_tokens.append(tokens + pending)
        pending = 0
        last_text_at = now
    if not done:
        return result.fail("cut", "the stream ended without [DONE]")
    if counted == 0:  # a server that ignores stream_options.include_usage: no token counts to trust
        return result.fail("bad_stream", "the server sent no usage (stream_options.include_usage)")
    result.e2e = time.perf_counter() - result.started
    result.ok = result.ttft is not None
    if not result.ok:
        return result.fail("bad_stream", "the stream carried no output")
    return result


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body, or the text itself."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:200]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:200]
        if isinstance(data.get("message"), str):
            return str(data["message"])[:200]
    return text.strip()[:200]
