"""A benchmark run: the server checked, each traffic class run as its own phase with vLLM's
``/metrics`` read before and after it, and with ``against`` the same prompts on a second server
(speculation off) for the speedup per class."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from playbook.bench import client, stats
from playbook.bench.load import Load, run
from playbook.bench.prompts import Prompt


class BenchError(Exception):
    """The run cannot start (no server, no such model); the message says what to do."""


@dataclass(frozen=True)
class Options:
    url: str
    prompts: Sequence[Prompt]
    load: Load
    model: str | None = None
    api: client.Api = "completions"
    per_class: bool = True
    temperature: float = 0.0
    max_tokens: int = 128
    timeout: float = 300.0  # one request, whole stream
    against: str | None = None


@dataclass
class Server:
    url: str
    model: str
    version: str | None
    positions: int  # k as vLLM counts it (draft positions), 0 without speculative decoding
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)


Progress = Callable[[str, client.Result], None]


async def bench(options: Options, progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (``partial`` when requests failed)."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        main = await _measure(session, options.url, options, progress)
        other = await _measure(session, options.against, options, progress) if options.against else None
    report: dict[str, Any] = {
        "server": _shown(main),
        "load": asdict(options.load),
        "api": options.api,
        "temperature": options.temperature,
        "max_tokens": options.max_tokens,
        "phases": main.phases,
    }
    if other is not None:
        report["against"] = {**_shown(other), "phases": other.phases}
        report["comparison"] = compare(main, other)
    failed = sum(p["summary"]["requests"] - p["summary"]["completed"] for p in main.phases.values())
    report["partial"] = failed > 0 or (
        other is not None
        and any(p["summary"]["requests"] > p["summary"]["completed"] for p in other.phases.values())
    )
    return report


def _shown(server: Server) -> dict[str, Any]:
    return {
        "url": server.url,
        "model": server.model,
        "vllm_version": server.version,
        "draft_positions": server.positions,
    }


async def _measure(
    session: aiohttp.ClientSession, url: str, options: Options, progress: Progress | None
) -> Server:
    url = url.rstrip("/")
    model = await _model(session, url, options.model)
    version = await _version(session, url)
    groups: dict[str, list[Prompt]] = {}
    for prompt in options.prompts:
        groups.setdefault(prompt.klass if options.per_class else "all", []).append(prompt)
    server = Server(url, model, version, 0)
    for klass, prompts in groups.items():

        async def send(prompt: Prompt) -> client.Result:
            request = client.body(
                options.api, model, prompt.text, prompt.max_tokens or options.max_tokens, options.temperature,
                options.load.seed,
            )  # fmt: skip
            return await client.send(session, url, options.api, request, prompt.klass, options.timeout)

        before = await _spec(session, url)
        results, seconds = await run(options.load, prompts, send, _reporter(progress, klass))
        after = await _spec(session, url)
        server.positions = max(server.positions, len(after.per_position))
        server.phases[klass] = {
            "summary": stats.summarize(results, seconds),
            "acceptance": stats.acceptance(before, after),
            "results": results,
        }
    return server


def _reporter(progress: Progress | None, klass: str) -> Callable[[client.Result], None] | None:
    if progress is None:
        return None
    return lambda result: progress(klass, result)


async def _model(session: aiohttp.ClientSession, url: str, wanted: str | None) -> str:
    try:
        async with session.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as answer:
            if answer.status != 200:
                raise BenchError(
                    f"{url}/v1/models answered {answer.status}: is this vLLM's OpenAI API server?"
                )
            body = await answer.json(content_type=None)
    except aiohttp.ClientConnectorError as exc:
        raise BenchError(
            f"nothing answers at {url} ({exc.os_error.strerror or exc}); a vLLM still loading its model "
            "refuses connections: wait until its /health answers"
        ) from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise BenchError(f"{url}/v1/models: {type(exc).__name__}: {exc}") from None
    served = (
        [str(m.get("id")) for m in body.get("data", []) if isinstance(m, dict)]
        if isinstance(body, dict)
        else []
    )
    if not served:
        raise BenchError(f"{url} serves no model (its /v1/models lists none)")
    if wanted is None:
        return served[0]
    if wanted not in served:
        raise BenchError(f"{url} does not serve {wanted!r}; it serves {', '.join(served)}")
    return wanted


async def _version(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url + "/version", timeout=aiohttp.ClientTimeout(total=10)) as answer:
            body = await answer.json(content_type=None) if answer.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return str(body["version"]) if isinstance(body, dict) and "version" in body else None


async def _spec(session: aiohttp.ClientSession, url: str) -> stats.SpecCounts:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as answer:
            if answer.status != 200:
                return stats.SpecCounts()
            return stats.spec_counts(await answer.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return stats.SpecCounts()


def compare(spec: Server, plain: Server) -> dict[str, Any]:
    """Per class: how much faster the speculative server decodes (median TPOT of the plain one over
    its own) and serves (median e2e), and the draft's cost per step, c: a streamed chunk is one
    engine step, so the median gap between chunks is the step time, (1 + k c) times the plain
    server's. (The speedup, S = L / (1 + k c) with L the mean acceptance length, would give c too,
    but a request's last step is cut short by max_tokens, which biases it on short outputs.)"""
    out: dict[str, Any] = {}
    for klass, phase in spec.phases.items():
        other = plain.phases.get(klass)
        if other is None:
            continue
        a, b = phase["summary"], other["summary"]
        tpot_a, tpot_b = a["tpot"]["p50"], b["tpot"]["p50"]
        e2e_a, e2e_b = a["e2e"]["p50"], b["e2e"]["p50"]
        speedup = tpot_b / tpot_a if tpot_a and tpot_b else None
        row: dict[str, Any] = {
            "tpot_speedup": speedup,
            "e2e_speedup": e2e_b / e2e_a if e2e_a and e2e_b else None,
            "gains": speedup is not None and speedup > 1.0,
        }
        step_a, step_b = a["itl"]["p50"], b["itl"]["p50"]
        if step_a and step_b and spec.positions:
            row["draft_cost"] = max(0.0, (step_a / step_b - 1) / spec.positions)
        out[klass] = row
    return out


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
