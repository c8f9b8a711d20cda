"""A small load generator: concurrent streaming chat requests against a vLLM-compatible server.

The demo uses it to keep the simulator busy; its sampling temperature can change while it runs,
which is how a real server's acceptance collapses (traffic moving to a high temperature). With a
``route``, each request asks it which server to go to, as a router reading a feature flag does, and
the latency each request took, as its client saw it, is kept with the server that answered. Behind
specguard's nginx router, that is the pool its answer names in ``X-Specguard-Pool``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

log = logging.getLogger("specguard.traffic")
POOL_HEADER = "X-Specguard-Pool"  # the pool specguard's nginx router sent a request to


@dataclass
class TrafficStats:
    requests: int = 0
    tokens: int = 0
    errors: int = 0
    by_server: Counter[str] = field(default_factory=Counter)  # requests answered, per server (see Served)


@dataclass(frozen=True)
class Served:
    """One request as its client saw it."""

    finished: float  # time.monotonic()
    seconds: float
    server: str  # the pool named by the answer's X-Specguard-Pool, else the base URL it was sent to
    tokens: int


class Traffic:
    def __init__(
        self,
        url: str,
        model: str,
        concurrency: int = 4,
        max_tokens: int = 48,
        temperature: float = 0.0,
        route: Callable[[], str] | None = None,
        on_answer: Callable[[float, str], None] | None = None,
    ):
        self.base = url.rstrip("/")
        self.route = route  # the base URL for each request; None: always ``url``
        # told (when the request started, its server as Served.server) as each answer's headers arrive
        self.on_answer = on_answer
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stats = TrafficStats()
        self.served: deque[Served] = deque(maxlen=5000)
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.concurrency)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _worker(self, index: int) -> None:
        while True:
            try:
                # not `+= await ...`: that reads the total before the await and loses other workers' tokens
                server = self.route() if self.route is not None else self.base
                started = time.monotonic()
                tokens, where = await self.one_request(
                    f"request {self.stats.requests} from worker {index}", server, started
                )
                finished = time.monotonic()
                self.served.append(Served(finished, finished - started, where, tokens))
                self.stats.tokens += tokens
                self.stats.requests += 1
                self.stats.by_server[where] += 1
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.stats.errors += 1
                log.debug("traffic request failed: %s", exc)
                await asyncio.sleep(0.5)  # the server is down or restarting: do not spin

    def latency(
        self, since: float, until: float | None = None, quantile: float = 0.95, whole: bool = False
    ) -> float | None:
        """The ``quantile`` of the latencies of requests finished in [since, until) (monotonic);
        ``whole``: of those that also started in it."""
        values = sorted(
            s.seconds
            for s in self.served
            if (s.finished - s.seconds if whole else s.finished) >= since
            and (until is None or s.finished < until)
        )
        if not values:
            return None
        return values[min(len(values) - 1, int(quantile * len(values)))]

    async def one_request(
        self, prompt: str, server: str | None = None, started: float | None = None
    ) -> tuple[int, str]:
        """Send one streaming request (``started``: when, for ``on_answer``); returns the completion
        tokens the server reported and where it was served (as Served.server)."""
        assert self._session is not None
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        completion = 0
        url = (server or self.base) + "/v1/chat/completions"
        async with self._session.post(url, json=body) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {(await response.text())[:200]}")
            where = response.headers.get(POOL_HEADER) or (server or self.base)
            if self.on_answer is not None:
                self.on_answer(time.monotonic() if started is None else started, where)
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    completion = int(usage["completion_tokens"])
        return completion, where
