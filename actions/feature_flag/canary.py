"""The canary before a restore: once traffic has moved to standard decoding, the speculative
server's acceptance cannot be seen from its traffic any more. A few requests sent straight to it,
with its ``/metrics`` read before and after, measure acceptance for exactly those requests (and
whatever else it served meanwhile)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specguard.actions.acceptance import Counters, ImpossibleCounters, SprtParams, sprt_probe
from specguard.actions.feature_flag.answers import Answer, AnswerError, FollowRedirects, fetch
from specguard.common.http import MAX_RESPONSE_SIZE
from specguard.common.secrets import SecretRef
from specguard.common.sequential import Decision
from specguard.rules.durations import Duration

log = logging.getLogger("specguard.action.feature_flag")
CUT = 300  # a failed canary's reason is cut to this many characters

# Prompts whose continuations a draft model usually predicts well and badly alike: a mix, so that
# the canary sees acceptance as served traffic would rather than at its best.
PROMPTS = (
    "Explain in a few sentences how a hash table handles collisions.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarize the water cycle for a ten-year-old.",
    "List five things to check before deploying a web service to production.",
)


class CanaryParams(BaseModel):
    """``canary:`` of a ``feature_flag`` action."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # the speculative vLLM server itself (not the router), e.g. http://127.0.0.1:8000
    # Either a fixed bar, acceptance rate (accepted / draft tokens) at least this ...
    min_acceptance: float | None = Field(None, gt=0, le=1)
    # ... or a sequential test with stated error rates, ``requests`` per round (see actions/acceptance.py)
    sprt: SprtParams | None = None
    requests: int = Field(4, ge=1, le=64)
    prompts: tuple[str, ...] = PROMPTS
    max_tokens: int = Field(64, ge=2, le=4096)
    # Acceptance falls as sampling temperature rises: send the canary's requests at your traffic's
    # usual temperature, or it measures the draft at its best.
    temperature: float = Field(0.0, ge=0, le=2)
    model: str | None = None  # None: the first model /v1/models lists
    min_draft_tokens: int = Field(32, ge=1)  # fewer proposals than this say nothing either way
    timeout: Duration = Field(60.0, gt=0)  # for the whole probe
    token: SecretRef | None = None  # vLLM's --api-key, sent as a bearer token

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("give the server's http:// or https:// base URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_test(self) -> CanaryParams:
        if (self.min_acceptance is None) == (self.sprt is None):
            raise ValueError(
                "give the canary one test: `min_acceptance` (a fixed bar) or `sprt` (a sequential test)"
            )
        return self

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or not all(p.strip() for p in value):
            raise ValueError("give at least one non-empty prompt")
        return value


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    detail: str
    acceptance: float | None = None
    drafted: float = 0.0


class CanaryError(Exception):
    """The canary's server answered something that cannot be so; the message says what."""


class Canary:
    def __init__(
        self,
        params: CanaryParams,
        token: str | None,
        limit: int = MAX_RESPONSE_SIZE,
        follow: FollowRedirects = "never",
    ) -> None:
        self.params = params
        self._token = token
        self.limit = limit  # max_response_size
        self.follow = follow  # follow_redirects

    async def probe(self) -> CanaryResult:
        """Never raises: a server that does not answer, or answers what cannot be so, is a
        failed canary, with the reason."""
        p = self.params
        try:
            async with (
                asyncio.timeout(p.timeout),
                aiohttp.ClientSession(headers=self._headers()) as session,
            ):
                model = p.model or await self._model(session)
                counters = Counters()
                if p.sprt is not None:
                    return await self._sequential(session, model, p.sprt, counters)
                before = counters.read(await self._get(session, "/metrics"))
                sent = await self._round(session, model)
                after = counters.read(await self._get(session, "/metrics"))
        except TimeoutError:
            return CanaryResult(False, f"canary: {p.url} did not answer within {p.timeout:g}s")
        except (CanaryError, AnswerError, ImpossibleCounters) as exc:
            return CanaryResult(False, f"canary: {exc}"[:CUT])
        except (aiohttp.ClientError, ValueError) as exc:
            return CanaryResult(False, f"canary: {p.url}: {type(exc).__name__}: {exc}"[:CUT])
        except Exception as exc:  # a bug here must not keep the fallback for good: a failed canary
            log.exception("canary: %s: the probe failed", p.url)
            return CanaryResult(False, f"canary: {p.url}: {type(exc).__name__}: {exc}"[:CUT])
        assert p.min_acceptance is not None
        counted = after.minus(before)
        accepted, drafted = counted.accepted, counted.draft_tokens
        tokens = sum(sent)
        if drafted < p.min_draft_tokens:
            return CanaryResult(
                False,
                f"canary: only {drafted:g} draft tokens proposed for {p.requests} requests "
                f"({tokens} tokens generated), fewer than {p.min_draft_tokens}: is speculative "
                "decoding on at this server?",
                drafted=drafted,
            )
        rate = accepted / drafted  # within [0, 1]: the counters were checked
        ok = rate >= p.min_acceptance
        verdict = "at or above" if ok else "below"
        return CanaryResult(
            ok,
            f"canary: acceptance {rate:.2f} over {drafted:g} draft tokens ({p.requests} requests), "
            f"{verdict} {p.min_acceptance:g}",
            rate,
            drafted,
        )

    async def _sequential(
        self, session: aiohttp.ClientSession, model: str, sprt: SprtParams, counters: Counters
    ) -> CanaryResult:
        """Rounds of ``requests`` until Wald's test says recovered (restore) or not (keep)."""

        async def send_round() -> None:
            await self._round(session, model)

        async def read_metrics() -> str:
            return await self._get(session, "/metrics")

        verdict = await sprt_probe(sprt, read_metrics, send_round, "canary", self.params.max_tokens)
        return CanaryResult(verdict.decision is Decision.RECOVERED, verdict.detail, verdict.alpha)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _fetch(self, session: aiohttp.ClientSession, method: str, path: str, **kwargs: Any) -> Answer:
        return await fetch(
            session, method, self.params.url + path, follow=self.follow, limit=self.limit, **kwargs
        )

    async def _round(self, session: aiohttp.ClientSession, model: str) -> list[int]:
        """The canary's ``requests`` completions, at once; the tokens each generated."""
        n = self.params.requests
        return list(await asyncio.gather(*(self._complete(session, model, i) for i in range(n))))

    async def _get(self, session: aiohttp.ClientSession, path: str) -> str:
        answer = await self._fetch(session, "GET", path)
        if answer.status != 200:
            raise CanaryError(f"{answer.where} answered {answer.status}")
        return answer.text()

    async def _model(self, session: aiohttp.ClientSession) -> str:
        answer = await self._fetch(session, "GET", "/v1/models")
        if answer.status != 200:
            raise CanaryError(f"{answer.where} answered {answer.status}")
        body = answer.json()
        try:
            model = body["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            raise CanaryError(f"{answer.where} lists no model: give canary.model") from None
        if not isinstance(model, str) or not model.strip():
            raise CanaryError(f"{answer.where} lists a model whose id is not a name: give canary.model")
        return model

    async def _complete(self, session: aiohttp.ClientSession, model: str, index: int) -> int:
        """One completion; returns the tokens it generated (from ``usage``): a whole number from 0
        to ``max_tokens``, or CanaryError."""
        p = self.params
        request = {
            "model": model,
            "prompt": p.prompts[index % len(p.prompts)],
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
        }
        answer = await self._fetch(session, "POST", "/v1/completions", json=request)
        if answer.status != 200:
            raise CanaryError(f"{answer.where} answered {answer.status}: {answer.quote()}".strip())
        body = answer.json()
        if not isinstance(body, dict):
            raise CanaryError(f"{answer.where} answered {type(body).__name__}, not a completion")
        usage = body.get("usage")
        if usage is None:
            return 0
        if not isinstance(usage, dict):
            raise CanaryError(f"{answer.where} answered usage {json.dumps(usage)[:40]}, not an object")
        tokens = usage.get("completion_tokens", 0)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= p.max_tokens:
            raise CanaryError(
                f"{answer.where} says it generated {json.dumps(tokens)[:40]} tokens: not a whole number "
                f"from 0 to max_tokens {p.max_tokens}"
            )
        return tokens
