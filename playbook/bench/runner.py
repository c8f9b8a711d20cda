"""A benchmark run: the server checked, the prompts that fit its context planned into phases (one
per traffic class), each phase warmed up and then measured between two reads of vLLM's
``/metrics``, and with ``against`` the same prompts on a second server (speculation off) for the
speedup per class."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import aiohttp

from specguard.playbook.bench import client, histograms, stats
from specguard.playbook.bench.load import Load, run, warm_up
from specguard.playbook.bench.plan import Plan, PlanError, count_tokens, plan
from specguard.playbook.bench.prompts import Prompt
from specguard.playbook.bench.routing import by_route


class BenchError(Exception):
    """The run cannot start (no server, no such model, nothing that fits); the message says what to do."""


@dataclass(frozen=True)
class Options:
    url: str
    prompts: Sequence[Prompt]
    load: Load  # num_prompts: requests in all, shared among the phases
    model: str | None = None
    api: client.Api = "completions"
    per_class: bool = True
    temperature: float = 0.0
    max_tokens: int = 128
    timeout: float = 300.0  # one request, whole stream
    against: str | None = None
    named_classes: tuple[str, ...] = ()  # classes asked for by name: the run fails if one cannot run
    source: str = ""  # where the prompts come from, for messages (a file's name)
    # Where the acceptance counters are read (default: url): through specguard's router, /metrics
    # is not a path it inspects and goes to its default pool, so give the speculative server's.
    metrics_url: str | None = None


@dataclass
class Server:
    url: str
    model: str
    version: str | None
    max_model_len: int | None  # from /v1/models; None when the server does not say
    metrics: str = ""  # whose /metrics counts its requests (default: url)
    positions: int = 0  # k as vLLM counts it (draft positions), 0 without speculative decoding
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    spans: list[histograms.Span] = field(default_factory=list)  # each phase's /metrics readings


class Progress(Protocol):
    """What the run tells as it goes (the command's progress line)."""

    def planned(self, requests: int | None, seconds: float | None) -> None:
        """The measured requests to come, or the measured seconds (a run for a duration)."""

    def update(self, klass: str, result: client.Result) -> None:
        """A measured request was answered (or failed)."""

    def note(self, line: str) -> None:
        """One line for the operator, before the run."""


# How long to wait, after the warm-up and after the measured requests, for vLLM's histograms to count
# the requests answered (vLLM may record one just after its last chunk went out).
SETTLE_SECONDS = 2.0
SETTLE_STEP = 0.1


async def bench(options: Options, progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (``partial`` when requests failed)."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        main = await _connect(session, options.url, options.model)
        main.metrics = (options.metrics_url or "").rstrip("/")
        other = await _connect(session, options.against, options.model) if options.against else None
        planned = await _plan(session, options, main, other)
        if progress is not None:
            for line in planned.notes:
                progress.note(line)
            servers = 2 if other is not None else 1
            requests = planned.requests
            duration = options.load.duration
            progress.planned(
                None if requests is None else requests * servers,
                None if duration is None else duration * len(planned.phases) * servers,
            )
        await _measure(session, main, planned, options, progress)
        if other is not None:
            await _measure(session, other, planned, options, progress)
    report: dict[str, Any] = {
        "server": _shown(main),
        "load": asdict(options.load),
        "api": options.api,
        "temperature": options.temperature,
        "max_tokens": options.max_tokens,
        "left_out": planned.left_out,
        "phases": main.phases,
        "overall": _overall(main),
    }
    routed = by_route(main.phases)
    if routed is not None:
        report["routing"] = routed
    if other is not None:
        report["against"] = {**_shown(other), "phases": other.phases, "overall": _overall(other)}
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
        "metrics_url": server.metrics or server.url,
        "model": server.model,
        "vllm_version": server.version,
        "max_model_len": server.max_model_len,
        "draft_positions": server.positions,
    }


def _overall(server: Server) -> dict[str, Any]:
    """Every phase together: the client's figures, and the server's histograms as the rules read them."""
    results = [r for phase in server.phases.values() for r in phase["results"]]
    seconds = sum(phase["summary"]["seconds"] for phase in server.phases.values())
    return {
        "client": stats.client_figures(results, seconds),
        "server": histograms.server_figures(server.model, server.spans),
    }


async def _connect(session: aiohttp.ClientSession, url: str, wanted: str | None) -> Server:
    url = url.rstrip("/")
    model, max_model_len = await _model(session, url, wanted)
    return Server(url, model, await _version(session, url), max_model_len)


async def _plan(session: aiohttp.ClientSession, options: Options, main: Server, other: Server | None) -> Plan:
    """The phases: the prompts that fit both servers' context with their output."""
    lengths = [s.max_model_len for s in (main, other) if s is not None and s.max_model_len is not None]
    limit = min(lengths) if lengths else None
    counts: dict[str, int] | None = None
    notes: list[str] = []
    if limit is not None:
        counted = await count_tokens(
            session, main.url, main.model, options.api, [p.text for p in options.prompts]
        )
        if isinstance(counted, str):
            notes.append(
                f"prompts not checked against max_model_len {limit}: {counted}; longer ones will fail"
            )
        else:
            counts = counted
    try:
        made = plan(
            options.prompts, per_class=options.per_class, num_prompts=options.load.num_prompts,
            duration=options.load.duration, max_tokens=options.max_tokens, named=options.named_classes,
            limit=limit, counts=counts, source=options.source,
        )  # fmt: skip
    except PlanError as exc:
        raise BenchError(str(exc)) from None
    return replace(made, notes=(*notes, *made.notes))


async def _measure(
    session: aiohttp.ClientSession, server: Server, planned: Plan, options: Options, progress: Progress | None
) -> None:
    for phase in planned.phases:

        async def send(prompt: Prompt) -> client.Result:
            temperature = options.temperature if prompt.temperature is None else prompt.temperature
            request = client.body(
                options.api, server.model, prompt.text, prompt.max_tokens or options.max_tokens,
                temperature, options.load.seed,
            )  # fmt: skip
            return await client.send(session, server.url, options.api, request, prompt.klass, options.timeout)

        start = await _read(session, server.metrics or server.url)
        warmed = await warm_up(options.load, phase.prompts, send)
        before = await _settled(session, server, start, sum(1 for r in warmed if r.ok))
        load = replace(options.load, num_prompts=phase.requests, warmup=0)
        results, seconds = await run(load, phase.prompts, send, _reporter(progress, phase.klass))
        after = await _settled(session, server, before, sum(1 for r in results if r.ok))
        spec_before, spec_after = _spec(before), _spec(after)
        server.positions = max(server.positions, len(spec_after.per_position))
        measured: dict[str, Any] = {
            "summary": stats.summarize(results, seconds),
            "acceptance": stats.acceptance(spec_before, spec_after),
            "server": {},
            "results": results,
        }
        if before is not None and after is not None:
            span = (before, after)
            server.spans.append(span)
            measured["server"] = histograms.server_figures(server.model, [span])
            counted = histograms.requests_counted(server.model, span)
            if counted is not None and counted > len(results):
                measured["server_note"] = (
                    f"the server finished {counted:.0f} requests during the phase, {len(results)} of them "
                    "the benchmark's: its histogram figures include the others"
                )
        server.phases[phase.klass] = measured


async def _settled(
    session: aiohttp.ClientSession, server: Server, before: histograms.Reading | None, completed: int
) -> histograms.Reading | None:
    """The server's page once its e2e histogram has counted the ``completed`` requests answered
    since ``before``, or the last one read within SETTLE_SECONDS."""
    after = await _read(session, server.metrics or server.url)
    deadline = time.monotonic() + SETTLE_SECONDS
    while before is not None and after is not None and time.monotonic() < deadline:
        counted = histograms.requests_counted(server.model, (before, after))
        if counted is None or counted >= completed:
            break
        await asyncio.sleep(SETTLE_STEP)
        after = await _read(session, server.metrics or server.url) or after
    return after


def _spec(reading: histograms.Reading | None) -> stats.SpecCounts:
    if reading is None:
        return stats.SpecCounts()
    try:
        return stats.spec_counts(reading.text)
    except ValueError:  # not a page prometheus_client can read: no acceptance figures
        return stats.SpecCounts()


def _reporter(progress: Progress | None, klass: str) -> Callable[[client.Result], None] | None:
    if progress is None:
        return None
    return lambda result: progress.update(klass, result)


async def _model(session: aiohttp.ClientSession, url: str, wanted: str | None) -> tuple[str, int | None]:
    """The model to benchmark and its context length (``max_model_len``, None if not given)."""
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
    cards = [m for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []
    served = {str(card.get("id")): card for card in cards}
    if not served:
        raise BenchError(f"{url} serves no model (its /v1/models lists none)")
    model = wanted if wanted is not None else next(iter(served))
    if model not in served:
        raise BenchError(f"{url} does not serve {wanted!r}; it serves {', '.join(served)}")
    length = served[model].get("max_model_len")
    valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
    return model, length if valid else None


async def _version(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url + "/version", timeout=aiohttp.ClientTimeout(total=10)) as answer:
            body = await answer.json(content_type=None) if answer.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return str(body["version"]) if isinstance(body, dict) and "version" in body else None


async def _read(session: aiohttp.ClientSession, url: str) -> histograms.Reading | None:
    """The server's ``/metrics`` now, or None when it has none to give."""
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=30)) as answer:
            if answer.status != 200:
                return None
            text = await answer.text()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return histograms.reading(text)


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
        bursty = _bursty(phase, other)
        if bursty:
            row["draft_cost_unknown"] = bursty
        elif step_a and step_b and spec.positions:
            row["draft_cost"] = max(0.0, (step_a / step_b - 1) / spec.positions)
        out[klass] = row
    return out


def _bursty(*phases: dict[str, Any]) -> str | None:
    """Why the chunk gaps of these phases do not time engine steps, or None: a share of them too short
    to be steps (stats.BURST_GAP), so their median is the bursts', not the step's."""
    for phase, name in zip(phases, ("the speculative server's", "the plain server's"), strict=False):
        share = stats.burst_share(phase.get("results") or [])
        if share is not None and share > stats.BURSTY_SHARE:
            return (
                f"{name} streams arrived in bursts ({share:.0%} of chunk gaps under "
                f"{stats.BURST_GAP * 1000:g} ms): their chunk gaps do not time engine steps"
            )
    return None


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
