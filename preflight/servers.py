"""The running vLLM servers, as they say of themselves: ``/version``, ``/v1/models`` and the k their
``/metrics`` counts (one per-position acceptance series per draft position, created at start-up).

The servers are the config's scrape targets (``sources.scrape.targets``; with the Prometheus source,
``history.scrape.targets``, the servers the daemon keeps history of); a target's base URL is its
URL without ``/metrics``. Read once per run and kept in ``Context.cache`` for every item.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

from specguard.actions.vllm_restart.server import positions
from specguard.common.http import json_limited, text_limited
from specguard.common.redact import scrub, shown
from specguard.preflight.item import Context
from specguard.sources.targets import instance_label

CACHE_KEY = "servers"
TIMEOUT = 10.0  # seconds, each request
MAX_PAGE = 16 * 1024 * 1024  # a /metrics page (about 60 KB per model on a real vLLM)


@dataclass(frozen=True)
class ServerFacts:
    metrics_url: str  # as configured (shown: credentials removed)
    base_url: str
    instance: str  # the instance label its history is kept under
    version: str | None  # /version's, None when it did not answer (see errors)
    models: tuple[str, ...]  # /v1/models ids (the served model names)
    roots: tuple[str, ...]  # /v1/models roots (the model each serves: a path or hub id)
    k: int | None  # draft positions counted on /metrics; 0: no speculative decoding; None: unread
    errors: tuple[str, ...]  # what could not be read, one line each

    @property
    def name(self) -> str:
        return self.base_url

    @property
    def model(self) -> str | None:
        return self.models[0] if self.models else None

    def labels(self) -> dict[str, str]:
        """The labels its series carry, for the baseline's entry_for."""
        out = {"instance": self.instance}
        if self.model is not None:
            out["model_name"] = self.model
        return out


def targets(ctx: Context) -> list[tuple[str, str]]:
    """(metrics URL, instance label) of every configured vLLM server."""
    config = ctx.loaded.config
    scrape = config.scrape if config.sources.prometheus is None else config.history.scrape
    if scrape is None:
        return []
    names = scrape.names
    return [(url, names.get(url) or instance_label(url)) for url in scrape.urls]


def base_of(metrics_url: str) -> str:
    url = metrics_url.rstrip("/")
    return url.removesuffix("/metrics") if url.endswith("/metrics") else url


async def servers(ctx: Context) -> list[ServerFacts]:
    """Every configured server's facts, read once per run."""
    cached = ctx.cache.get(CACHE_KEY)
    if cached is None:
        found = targets(ctx)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
            cached = list(await asyncio.gather(*(_read(session, url, name) for url, name in found)))
        ctx.cache[CACHE_KEY] = cached
    assert isinstance(cached, list)
    return cached


def describe(server: ServerFacts) -> str:
    """One line of what a server said."""
    k = "k unknown" if server.k is None else "no speculative decoding" if server.k == 0 else f"k={server.k}"
    version = server.version or "?"
    return f"{server.base_url}: model {server.model or '?'}, vLLM {version}, {k}"


def down_fix(server: ServerFacts) -> str:
    """The fix when a server did not answer."""
    return f"start the vLLM server at {server.base_url}, or correct the config's scrape targets"


async def _read(session: aiohttp.ClientSession, metrics_url: str, instance: str) -> ServerFacts:
    base = base_of(metrics_url)
    errors: list[str] = []
    version_body = await _get(session, base + "/version", errors, json=True)
    models_body = await _get(session, base + "/v1/models", errors, json=True)
    page = await _get(session, metrics_url, errors, json=False)
    version = version_body.get("version") if isinstance(version_body, dict) else None
    cards = models_body.get("data") if isinstance(models_body, dict) else None
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    k: int | None = None
    if isinstance(page, str):
        try:
            spec, seen = positions(page)
            k = len(seen) if spec else 0
        except ValueError as exc:
            errors.append(f"{shown(metrics_url)}: not a metrics page ({exc})")
    return ServerFacts(
        metrics_url=shown(metrics_url),
        base_url=shown(base),
        instance=instance,
        version=str(version) if version is not None else None,
        models=tuple(str(c["id"]) for c in cards if "id" in c),
        roots=tuple(str(c.get("root") or c["id"]) for c in cards if "id" in c),
        k=k,
        errors=tuple(errors),
    )


async def _get(session: aiohttp.ClientSession, url: str, errors: list[str], json: bool) -> Any:
    try:
        async with session.get(url) as answer:
            if answer.status != 200:
                errors.append(f"{shown(url)}: HTTP {answer.status}")
                return None
            return await (json_limited(answer, MAX_PAGE) if json else text_limited(answer, MAX_PAGE))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        said = scrub(str(exc), url)
        errors.append(f"{shown(url)}: {type(exc).__name__}" + (f": {said}" if said else ""))
        return None
    except Exception as exc:  # a page too large, say
        errors.append(f"{shown(url)}: {scrub(str(exc), url)}")
        return None
