"""The vLLM server being restarted: its version, its readiness, and what its ``/metrics`` say about
the speculative config it runs with.

``/health`` and ``/version`` are read as from a stranger: the body up to ``max_response_size`` (over
it, the check fails with that reason, the rest unread) and no redirect followed (a ``/health`` that
sends elsewhere is not this server being healthy)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from specguard.actions.acceptance import ImpossibleCounters, SprtParams, Verdict, sprt_probe
from specguard.common.http import MAX_RESPONSE_SIZE, TooLarge, json_limited, read_limited, text_limited

log = logging.getLogger("specguard.action.vllm_restart")

PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SPEC_PREFIX = "vllm:spec_decode_"


class NotReady(Exception):
    """The server did not become healthy, or does not run the config it should."""


class ServerDown(NotReady):
    """While it was awaited, the server's process was seen down: its start failed."""


def positions(page: str) -> tuple[bool, set[int]]:
    """(whether any speculative-decoding series is exported, the draft positions counted)."""
    spec, seen = False, set()
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name.startswith(SPEC_PREFIX):
                spec = True
            if sample.name in (PER_POSITION, PER_POSITION + "_total") and "position" in sample.labels:
                seen.add(int(sample.labels["position"]))
    return spec, seen


class Server:
    def __init__(
        self,
        url: str,
        token: str | None,
        request_timeout: float = 10.0,
        max_response_size: int = MAX_RESPONSE_SIZE,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.limit = max_response_size

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)

    async def version(self) -> str | None:
        """``/version``'s answer, or None when the server does not answer it (a redirect, or a
        body over ``max_response_size``, is no answer: logged with the reason)."""
        try:
            async with (
                self._session() as session,
                session.get(self.url + "/version", allow_redirects=False) as answer,
            ):
                if answer.status != 200:
                    if 300 <= answer.status < 400:
                        log.warning("%s/version: %s", self.url, _redirect(answer))
                    return None
                body = await json_limited(answer, self.limit)
        except TooLarge as exc:
            log.warning("%s/version: %s", self.url, exc)
            return None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        version = body.get("version") if isinstance(body, dict) else None
        return version[:100] if isinstance(version, str) else None

    async def wait_healthy(
        self, timeout: float, poll: float = 1.0, watch: Callable[[], Awaitable[str | None]] | None = None
    ) -> float:
        """Wait for ``/health`` to answer 200 (refused connections meanwhile are the model
        loading); returns the seconds waited. Raises NotReady after ``timeout``; with ``watch``
        (None while the server's process runs, else why it is down), looked at after each
        unanswered poll, ServerDown as soon as it says why."""
        started = time.monotonic()
        last = "no answer"
        async with self._session() as session:
            while True:
                try:
                    async with session.get(self.url + "/health", allow_redirects=False) as answer:
                        if answer.status == 200:
                            await read_limited(answer, self.limit)  # a 200 is its whole answer
                            return time.monotonic() - started
                        last = f"/health answered {answer.status}"
                        if 300 <= answer.status < 400:
                            last += f": {_redirect(answer)}"
                except TooLarge as exc:
                    last = f"/health answered 200, but {exc}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = type(exc).__name__
                down = await watch() if watch is not None else None
                if down is not None:
                    raise ServerDown(down)
                if time.monotonic() - started + poll > timeout:
                    raise NotReady(f"not healthy within {timeout:g}s (last: {last})")
                await asyncio.sleep(poll)

    async def verify(self, k: int, requests: int, max_tokens: int, model: str | None) -> str:
        """Send a few requests, then check that ``/metrics`` counts exactly k draft positions (k =
        0: no speculative-decoding series at all). Returns what was seen; raises NotReady."""
        try:
            async with self._session() as session:
                name = model or await self._model(session)
                for index in range(requests):
                    body = {"model": name, "prompt": f"specguard check {index}: one two three",
                            "max_tokens": max_tokens, "temperature": 0.0}  # fmt: skip
                    async with session.post(self.url + "/v1/completions", json=body) as answer:
                        if answer.status != 200:
                            text = (await text_limited(answer, self.limit))[:200]
                            raise NotReady(f"POST /v1/completions answered {answer.status}: {text}")
                async with session.get(self.url + "/metrics") as answer:
                    if answer.status != 200:
                        raise NotReady(f"GET /metrics answered {answer.status}")
                    page = await text_limited(answer, self.limit)
        except TooLarge as exc:
            raise NotReady(f"verification: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NotReady(f"verification: {type(exc).__name__}: {exc}"[:300]) from None
        spec, seen = positions(page)
        if k == 0:
            if spec:
                raise NotReady("speculative decoding should be off, yet /metrics has spec_decode series")
            return "no speculative-decoding series: off, as configured"
        if seen != set(range(k)):
            shown = ",".join(str(p) for p in sorted(seen)) or "none"
            raise NotReady(f"/metrics counts draft positions {shown}, not 0-{k - 1}")
        return f"/metrics counts draft positions 0-{k - 1}"

    async def probe_acceptance(
        self, sprt: SprtParams, requests: int, max_tokens: int, temperature: float, model: str | None
    ) -> Verdict:
        """Has acceptance recovered? Rounds of ``requests`` completions, Wald's test on the counters
        after each. Raises NotReady when the server does not answer."""
        try:
            async with self._session() as session:
                name = model or await self._model(session)

                async def metrics() -> str:
                    async with session.get(self.url + "/metrics") as answer:
                        if answer.status != 200:
                            raise NotReady(f"GET /metrics answered {answer.status}")
                        return await text_limited(answer, self.limit)

                async def send_round() -> None:
                    for index in range(requests):
                        body = {"model": name, "prompt": f"specguard acceptance check {index}: one two three",
                                "max_tokens": max_tokens, "temperature": temperature}  # fmt: skip
                        async with session.post(self.url + "/v1/completions", json=body) as answer:
                            if answer.status != 200:
                                text = (await text_limited(answer, self.limit))[:200]
                                raise NotReady(f"POST /v1/completions answered {answer.status}: {text}")

                return await sprt_probe(sprt, metrics, send_round, "acceptance", max_tokens)
        except (TooLarge, ImpossibleCounters) as exc:
            raise NotReady(f"acceptance check: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NotReady(f"acceptance check: {type(exc).__name__}: {exc}"[:300]) from None

    async def _model(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.url + "/v1/models") as answer:
            if answer.status != 200:
                raise NotReady(f"GET /v1/models answered {answer.status}")
            try:
                body = await json_limited(answer, self.limit)
            except ValueError:
                raise NotReady("/v1/models answered with a body that is not JSON") from None
        try:
            return str(body["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise NotReady("/v1/models lists no model") from None


def _redirect(answer: aiohttp.ClientResponse) -> str:
    where = answer.headers.get("Location", "")
    return f"a redirect to {where[:200]!r}, not followed" if where else "a redirect, not followed"
