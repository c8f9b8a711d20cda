"""What shows that traffic moved: small requests of the drill's own sent through the router, which
names the pool that answered each (``X-Specguard-Pool``) and counts them by pool on its admin
location (``/specguard/metrics``), and the standard servers' own request counter
(``vllm:request_success_total``), which rises when they serve.

With a router, the proof does not wait on production traffic: ``probe_requests`` requests before
the flag is engaged (to the pool their class names), while it is engaged (every one to the
fallback pool, answered there, and counted there by the router), and after the restore (back).
Without one (no ``routing:`` section), the standard servers' counter must rise while the flag is
engaged: that is production traffic, which must be flowing.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp

from specguard.common.http import TooLarge, json_limited, text_limited
from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.classify import classify

PROMPT = "specguard preflight: fallback drill"
# The probes' bodies, the cheapest first: the routing classes may send short or unstreamed
# requests to the standard pool anyway (the playbook's do), where they would show no move.
SHAPES: tuple[dict[str, object], ...] = (
    {"max_tokens": 8},
    {"max_tokens": 64, "stream": False},
    {"max_tokens": 64, "stream": True},
    {"max_tokens": 256, "stream": True},
)
REQUEST_TIMEOUT = 30.0
POLL = 1.0  # between two looks while waiting for traffic to move (each look sends the probes)
_ROUTED = re.compile(r'^specguard_route_requests_total\{class="[^"]*",pool="([^"]*)"\} (\d+)$', re.M)
_ENGAGED = re.compile(r"^specguard_route_fallback_engaged (\d+)$", re.M)
_SERVED = re.compile(r"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


class NoProof(Exception):
    """Traffic cannot be shown moving (or coming back); the message says what was seen."""


@dataclass(frozen=True)
class Router:
    """What the router's admin location says: requests by pool, and its flag as a gauge."""

    by_pool: Counter[str]
    engaged: bool


def _url(address: str) -> str:
    return f"http://{address}"


class Traffic:
    def __init__(
        self,
        routing: RoutingConfig | None,
        standard: tuple[str, ...],
        probes: int,
        model: str | None,
        timeout: float,
        standard_required: bool = True,
        token: str | None = None,  # vLLM's --api-key (the canary's), sent with the probes
    ) -> None:
        self.token = token
        self.routing = routing
        self.standard = standard  # the standard servers' /metrics URLs
        # False: the routing section's fallback pool, read when it answers (the router's answers
        # are the proof); True: given (preflight.drill.standard_metrics), or the only proof there is
        self.standard_required = standard_required or routing is None
        self.probes = probes
        self.model = model
        self.timeout = timeout
        self.shape: dict[str, object] = dict(SHAPES[0])
        self.expected = ""  # the pool the probes' class goes to while the flag is not engaged
        self._served: float | None = None  # the standard servers' requests before the engage
        self._routed: Counter[str] = Counter()

    @property
    def fallback_pool(self) -> str:
        assert self.routing is not None
        return self.routing.fallback_pool

    def body(self) -> bytes:
        return json.dumps({"model": self.model, "prompt": PROMPT, "temperature": 0, **self.shape}).encode()

    def _shape(self) -> None:
        """The probes' shape: the first of ``SHAPES`` whose class goes to a pool other than the
        fallback pool while the flag is off, so that the move shows in the pool that answers."""
        assert self.routing is not None
        for shape in SHAPES:
            self.shape = shape
            if classify(self.routing, "POST", "/v1/completions", self.body()).pool != self.fallback_pool:
                return
        self.shape = SHAPES[0]

    # --- reading ------------------------------------------------------------------------------

    async def _get(self, session: aiohttp.ClientSession, url: str) -> str:
        try:
            async with session.get(url) as answer:
                text = await text_limited(answer)
                if answer.status != 200:
                    raise NoProof(f"GET {url} answered {answer.status}")
                return text
        except (aiohttp.ClientError, TimeoutError, TooLarge, UnicodeDecodeError) as exc:
            raise NoProof(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None

    async def router(self, session: aiohttp.ClientSession) -> Router:
        assert self.routing is not None
        text = await self._get(session, _url(self.routing.admin_listen) + "/specguard/metrics")
        by_pool: Counter[str] = Counter()
        for pool, value in _ROUTED.findall(text):
            by_pool[pool] += int(value)
        gauge = _ENGAGED.search(text)
        return Router(by_pool, gauge is not None and gauge.group(1) != "0")

    async def served(self, session: aiohttp.ClientSession) -> float:
        """The standard servers' finished requests, summed."""
        total = 0.0
        for url in self.standard:
            text = await self._get(session, url)
            found = _SERVED.findall(text)
            if not found:
                raise NoProof(f"{url} has no vllm:request_success_total: is it a vLLM's /metrics?")
            total += sum(float(value) for value in found)
        return total

    async def _model(self, session: aiohttp.ClientSession) -> str:
        assert self.routing is not None
        url = _url(self.routing.listen) + "/v1/models"
        try:
            async with session.get(url) as answer:
                body = await json_limited(answer)
                if answer.status != 200:
                    raise NoProof(f"GET {url} answered {answer.status}")
            model = body["data"][0]["id"]
        except (aiohttp.ClientError, TimeoutError, TooLarge, ValueError) as exc:
            raise NoProof(f"GET {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
        except (KeyError, IndexError, TypeError):
            raise NoProof(f"GET {url} lists no model: give the canary's model") from None
        if not isinstance(model, str):
            raise NoProof(f"GET {url} lists a model whose id is not a name: give the canary's model")
        return model

    async def _probe(self, session: aiohttp.ClientSession) -> tuple[int | None, str]:
        """One request through the router: its status and the pool that answered (or the error)."""
        assert self.routing is not None
        url = _url(self.routing.listen) + "/v1/completions"
        try:
            async with session.post(
                url, data=self.body(), headers={"Content-Type": "application/json"}
            ) as answer:
                await text_limited(answer)
                return answer.status, answer.headers.get("X-Specguard-Pool", "?")
        except (aiohttp.ClientError, TimeoutError, TooLarge, UnicodeDecodeError) as exc:
            return None, f"{type(exc).__name__}: {exc}".rstrip(": ")

    async def _round(self, session: aiohttp.ClientSession) -> list[tuple[int | None, str]]:
        return list(await asyncio.gather(*(self._probe(session) for _ in range(self.probes))))

    @staticmethod
    def _said(round_: list[tuple[int | None, str]]) -> str:
        shown = Counter(f"{status} from {pool}" if status is not None else pool for status, pool in round_)
        return ", ".join(f"{n}x {what}" for what, n in shown.most_common())

    def _session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT), headers=headers)

    # --- the three looks --------------------------------------------------------------------

    async def before(self) -> list[str]:
        """Before the engage: the router answers, its flag is off, the probes go where their class
        says; the standard servers' counter read. NoProof: nothing can be shown (nothing changed)."""
        evidence: list[str] = []
        if self.routing is None and not self.standard:
            raise NoProof(
                "nothing can show traffic moving: no routing: section (the router's pools and "
                "counters) and no preflight.drill.standard_metrics"
            )
        async with self._session() as session:
            if self.routing is not None:
                if self.model is None:
                    self.model = await self._model(session)
                self._shape()
                decision = classify(self.routing, "POST", "/v1/completions", self.body())
                self.expected = decision.pool
                router = await self.router(session)
                if router.engaged:
                    raise NoProof("the router's flag is engaged already (specguard_route_fallback_engaged 1)")
                answered = await self._round(session)
                self._routed = (await self.router(session)).by_pool
                if any(status != 200 or pool != self.expected for status, pool in answered):
                    raise NoProof(
                        f"before the engage the probes (class {decision.klass}, pool {self.expected}) "
                        f"were answered {self._said(answered)}: the router does not route as its config says"
                    )
                evidence.append(
                    f"before: {len(answered)} probe(s) through {self.routing.listen} answered 200 by pool "
                    f"{self.expected} (class {decision.klass})"
                )
            if self.standard:
                try:
                    self._served = await self.served(session)
                except NoProof as exc:
                    if self.standard_required:
                        raise
                    evidence.append(f"the standard servers' request counters not read ({exc})")
                    self.standard = ()
                    return evidence
                evidence.append(
                    f"standard servers' requests served before: {self._served:g} ({', '.join(self.standard)})"
                )
        return evidence

    async def moved(self) -> list[str]:
        """While the flag is engaged: every probe answered by the fallback pool and counted there,
        the router's flag on; or, without a router, the standard servers serving. NoProof past
        ``timeout``, saying what was seen last."""
        deadline = time.monotonic() + self.timeout
        evidence: list[str] = []
        async with self._session() as session:
            if self.routing is not None:
                last = ""
                while True:
                    answered = await self._round(session)
                    if all(status == 200 and pool == self.fallback_pool for status, pool in answered):
                        break
                    last = self._said(answered)
                    if time.monotonic() > deadline:
                        raise NoProof(
                            f"traffic did not move: {self.timeout:g}s after the engage the probes were "
                            f"answered {last}, not 200 from pool {self.fallback_pool}"
                        )
                    await asyncio.sleep(POLL)
                router = await self.router(session)
                rose = router.by_pool[self.fallback_pool] - self._routed[self.fallback_pool]
                if rose < len(answered) or not router.engaged:
                    raise NoProof(
                        f"the probes came back from pool {self.fallback_pool}, but the router counted "
                        f"{rose:+d} request(s) there and its fallback gauge reads {int(router.engaged)}"
                    )
                evidence.append(
                    f"engaged: {len(answered)} probe(s) answered 200 by pool {self.fallback_pool} "
                    f"(X-Specguard-Pool); the router counted {rose:+d} request(s) to {self.fallback_pool}, "
                    "specguard_route_fallback_engaged 1"
                )
            if self.standard:
                assert self._served is not None
                wanted = self.probes if self.routing is not None else 1
                while True:
                    now_served = await self.served(session)
                    if now_served - self._served >= wanted:
                        break
                    if time.monotonic() > deadline:
                        raise NoProof(
                            f"traffic did not move: the standard servers served {now_served - self._served:+g} "
                            f"request(s) in {self.timeout:g}s after the engage"
                            + ("" if self.routing is not None else " (is production traffic flowing?)")
                        )
                    await asyncio.sleep(POLL)
                evidence.append(
                    f"the standard servers served {now_served - self._served:+g} request(s) while engaged"
                )
        return evidence

    async def back(self) -> list[str]:
        """After the restore: the router's flag off and the probes where their class says again."""
        if self.routing is None:
            return []
        deadline = time.monotonic() + self.timeout
        async with self._session() as session:
            while True:
                answered = await self._round(session)
                router = await self.router(session)
                if not router.engaged and all(
                    status == 200 and pool == self.expected for status, pool in answered
                ):
                    break
                if time.monotonic() > deadline:
                    raise NoProof(
                        f"traffic did not come back: {self.timeout:g}s after the restore the probes were "
                        f"answered {self._said(answered)} (expected pool {self.expected}), the router's "
                        f"fallback gauge reads {int(router.engaged)}"
                    )
                await asyncio.sleep(POLL)
        moved = (
            " (the probes' class goes to the fallback pool anyway)"
            if self.expected == self.fallback_pool
            else ""
        )
        return [
            f"restored: {len(answered)} probe(s) answered 200 by pool {self.expected}{moved}, "
            "specguard_route_fallback_engaged 0"
        ]
