"""The simulator's HTTP side: vLLM's endpoints in front of the simulated engines.

Like vLLM, the port is not bound until "loading" (``startup_delay``) is over, so a client sees
connection refused, never a "loading" status; and a dead simulator (scenario ``die``) closes the
port and cuts in-flight streams, as a vLLM whose engine died does.

What a client can notice matches a real vLLM 0.32.0 (tests/fixtures/vllm-0.32.0-http.json, and the
real-vLLM tier compares the two live): status codes, content types (``application/json`` without a
charset), ``server: uvicorn`` and ``vary: Origin`` on every answer, ``allow`` on a 405, FastAPI's
``{"detail": ...}`` bodies for unknown routes and methods, and ``/metrics`` as sim.metrics explains.

A request with ``n`` choices, or a completion with several prompts, becomes one engine request per
prompt and choice, as vLLM fans them out; with several data-parallel engines each one is routed on
its own (sim.engine.router).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

from specguard.sim.engine.engine import Engine, RequestHandle
from specguard.sim.engine.records import GroundTruthLog, RequestRecord
from specguard.sim.engine.requests import EngineStopped, GenerationParams, StepOutput
from specguard.sim.engine.router import Router
from specguard.sim.metrics import VllmMetrics
from specguard.sim.openai.errors import RequestError, error_body
from specguard.sim.openai.requests import ChatCompletionRequest, CompletionRequest, Plan, parse_request, plan
from specguard.sim.openai.responses import (
    VLLM_VERSION,
    Choice,
    ResponseShape,
    models_body,
    sse,
    system_fingerprint,
    usage,
)
from specguard.sim.openai.tokenize import tokenize
from specguard.sim.options import SimOptions
from specguard.sim.scenario_player import run_scenario
from specguard.sim.tokens import Logprobs, TokenLogprob

log = logging.getLogger(__name__)

# How long a stop waits for in-flight requests before cutting them. The engine stops first, so no
# stream can finish anyway: keep it short.
SHUTDOWN_GRACE = 0.2
# Headers uvicorn and vLLM's CORS middleware put on every answer.
_COMMON_HEADERS = {"Server": "uvicorn", "Vary": "Origin"}

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Compact, as FastAPI's JSONResponse writes it, and without a charset parameter.
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


class Simulator:
    """A running simulator. Built by :func:`start_simulator`."""

    def __init__(
        self,
        options: SimOptions,
        engines: Sequence[Engine],
        metrics: VllmMetrics,
        runner: web.AppRunner,
        port: int,
        ground_truth_log: GroundTruthLog | None,
    ) -> None:
        self.options = options
        self.engines = list(engines)
        self.metrics = metrics
        self.port = port
        host = f"[{options.host}]" if ":" in options.host else options.host
        self.url = f"http://{host}:{port}"
        self.died = False
        self._runner = runner
        self._log = ground_truth_log
        self._scenario_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    @property
    def engine(self) -> Engine:
        """Engine 0: the engine, unless ``--data-parallel-size`` gave several."""
        return self.engines[0]

    def ground_truth(self) -> list[RequestRecord]:
        """Every request so far (the last 10,000 per engine), in arrival order."""
        records = [record for engine in self.engines for record in engine.records()]
        return sorted(records, key=lambda record: record.arrival_time)

    async def stop(self) -> None:
        """Stop serving: the port closes and in-flight requests are cut. Safe to call twice."""
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._shutdown(), name="sim-stop")
        await asyncio.shield(self._stop_task)

    async def wait_closed(self) -> None:
        """Return once the simulator stopped or died."""
        await self._closed.wait()

    def _start_scenario(self) -> None:
        if self.options.scenario is not None:
            scenario = self.options.scenario
            self._scenario_task = asyncio.create_task(
                run_scenario(scenario, self.engines, self._die), name="sim-scenario"
            )

    async def _die(self) -> None:
        log.warning("scenario: the simulated vLLM dies now")
        self.died = True
        await self.stop()

    async def _shutdown(self) -> None:
        task = self._scenario_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # Like a vLLM process going away: no more tokens, the port closes, and after a short grace
        # the connections still streaming are cut (their handlers cancelled), without a [DONE].
        for engine in self.engines:
            await engine.stop()
        await self._runner.cleanup()
        for engine in self.engines:
            engine.release()  # anything still waiting outside HTTP hears the engine stopped
        if self._log is not None:
            await self._log.close()
        self._closed.set()


async def start_simulator(options: SimOptions) -> Simulator:
    """Load (sleep ``startup_delay``), bind, start the engines and scenario; return once listening."""
    if options.startup_delay > 0:
        await asyncio.sleep(options.startup_delay)
    metrics = VllmMetrics(options)
    ground_truth_log = GroundTruthLog(options.ground_truth_file) if options.ground_truth_file else None
    on_record = ground_truth_log.append if ground_truth_log else None
    engines = [Engine(options, metrics, on_record, index=i) for i in range(options.data_parallel_size)]
    metrics.attach(engines)
    app = build_app(options, engines, metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE)
    await runner.setup()
    try:
        await web.TCPSite(runner, options.host, options.port).start()
    except BaseException:
        await runner.cleanup()
        raise
    port = int(runner.addresses[0][1])
    if ground_truth_log is not None:
        ground_truth_log.start()
    for engine in engines:
        engine.start()
    simulator = Simulator(options, engines, metrics, runner, port, ground_truth_log)
    simulator._start_scenario()
    return simulator


def build_app(options: SimOptions, engines: Sequence[Engine], metrics: VllmMetrics) -> web.Application:
    api = _Api(options, engines, metrics)
    app = web.Application(middlewares=[api.middleware])
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_get("/v1/models", api.models)
    app.router.add_post("/tokenize", api.tokenize)
    app.router.add_get("/health", api.health)
    app.router.add_get("/version", api.version)
    app.router.add_get("/load", api.load)
    app.router.add_route("*", "/ping", api.ping)  # SageMaker's health check, GET or POST
    app.router.add_route("*", "/metrics", api.metrics)
    app.router.add_route("*", "/metrics/{tail:.*}", api.metrics)  # vLLM's mount takes any sub-path
    app.router.add_get("/sim/ground-truth", api.ground_truth)
    return app


@dataclass
class _Choice:
    """One engine request serving one choice of one prompt."""

    index: int  # the choice's index in the response
    prompt: int  # which prompt of the request
    handle: RequestHandle
    logprobs: Logprobs | None
    text_offset: int = 0
    tokens: int = 0
    logprob_tokens: list[TokenLogprob] = field(default_factory=list)


class _Api:
    def __init__(self, options: SimOptions, engines: Sequence[Engine], metrics: VllmMetrics) -> None:
        self.options = options
        self.engines = list(engines)
        self.router = Router(engines)
        self.vllm_metrics = metrics
        self.started = int(time.time())
        self.fingerprint = system_fingerprint(options)
        self.in_flight = 0  # generation requests being served (vLLM's /load)

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """FastAPI-style errors (never a traceback), uvicorn's headers, the instrumentator's metrics."""
        started = time.perf_counter()
        resource = request.match_info.route.resource
        handler_name = resource.canonical if resource is not None else "none"
        try:
            response = await handler(request)
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(m for m in exc.allowed_methods if m != "HEAD"))
            response = _json({"detail": "Method Not Allowed"}, status=405, headers={"Allow": allowed})
        except web.HTTPException as exc:  # the router's 404
            response = _json({"detail": exc.reason}, status=exc.status)
        except Exception:
            log.exception("error serving %s %s", request.method, request.path)
            response = _json(error_body("Internal server error", 500), status=500)
        if not response.prepared:  # a stream has sent its headers already (set in _stream)
            response.headers.update(_COMMON_HEADERS)
        self.vllm_metrics.http.observe(
            handler_name,
            request.method,
            response.status,
            request.content_length or 0,
            response.content_length or 0,
            time.perf_counter() - started,
        )
        return response

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def models(self, request: web.Request) -> web.Response:
        return _json(models_body(self.options.model, self.options.max_model_len, self.started))

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            answer = tokenize(
                request.headers.get("Content-Type"),
                await request.read(),
                self.options.model,
                self.options.max_model_len,
            )
        except RequestError as exc:
            return _json(exc.body, status=exc.status)
        return _json(answer)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ping(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "POST", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VLLM_VERSION})

    async def load(self, request: web.Request) -> web.Response:
        return _json({"server_load": self.in_flight})

    async def metrics(self, request: web.Request) -> web.Response:
        # Rendered on the event loop, between engine steps: a scrape never sees half a step.
        body, headers = self.vllm_metrics.render(
            request.method,
            request.path,
            request.headers.get("Accept"),
            request.headers.get("Accept-Encoding"),
        )
        return web.Response(body=body, headers=headers)

    async def ground_truth(self, request: web.Request) -> web.Response:
        records = sorted(
            (record for engine in self.engines for record in engine.records()),
            key=lambda record: record.arrival_time,
        )
        return _json([record.to_json() for record in records])

    # --- generation ---------------------------------------------------------------------------------

    async def _generate(
        self, request: web.Request, kind: Literal["chat", "completion"]
    ) -> web.StreamResponse:
        model = ChatCompletionRequest if kind == "chat" else CompletionRequest
        try:
            body = parse_request(model, request.headers.get("Content-Type"), await request.read())
            accepted = plan(
                body, kind, self.options.model, self.options.max_model_len, self.options.max_logprobs
            )
        except RequestError as exc:
            return _json(exc.body, status=exc.status)
        request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:16]
        try:
            choices = self._submit(accepted, body.ignore_eos, request_id)
        except EngineStopped:
            return _json(error_body("The engine is not running.", 503), status=503)
        shape = ResponseShape(kind, request_id, self.options.model, self.fingerprint)
        self.in_flight += 1
        try:
            if body.stream:
                return await self._stream(
                    request, choices, accepted, shape, body.include_usage, body.continuous_usage
                )
            return await self._complete(choices, accepted, shape)
        finally:
            self.in_flight -= 1
            for choice in choices:
                choice.handle.abort()  # a no-op once finished; otherwise the client left or we stop

    def _submit(self, accepted: Plan, ignore_eos: bool, request_id: str) -> list[_Choice]:
        choices: list[_Choice] = []
        single = len(accepted.prompts) == 1 and accepted.n == 1
        try:
            for prompt_index, prompt in enumerate(accepted.prompts):
                for _ in range(accepted.n):
                    index = len(choices)
                    engine_id = request_id if single else f"{request_id}-{index}"
                    handle = self.router.pick().submit(
                        GenerationParams(
                            prompt_tokens=len(prompt),
                            max_tokens=accepted.max_tokens,
                            temperature=accepted.temperature,
                            ignore_eos=ignore_eos,
                            request_id=engine_id,
                            prompt_token_ids=prompt,
                        )
                    )
                    logprobs = None
                    if accepted.top_logprobs is not None:
                        seed = None if self.options.seed is None else f"{self.options.seed}/{engine_id}"
                        logprobs = Logprobs(random.Random(seed))
                    choices.append(_Choice(index, prompt_index, handle, logprobs))
        except BaseException:
            for choice in choices:
                choice.handle.abort()
            raise
        return choices

    def _logprobs(
        self, choice: _Choice, kind: str, output: StepOutput, top: int | None
    ) -> list[TokenLogprob] | None:
        if choice.logprobs is None or top is None:
            return None
        # Completions show the sampled token even with logprobs=0; chat shows exactly top_logprobs.
        count = max(top, 1) if kind == "completion" else top
        return [choice.logprobs.of(piece, count) for piece in output.pieces]

    def _finished(self, choices: Sequence[_Choice], accepted: Plan) -> None:
        """Per prompt, once all its choices finished normally: vLLM's per-request observations."""
        for prompt in range(len(accepted.prompts)):
            records = [c.handle.record for c in choices if c.prompt == prompt]
            if any(r.finish_reason in (None, "abort") for r in records):
                continue
            last = max(records, key=lambda r: r.finished_time or 0.0)
            self.vllm_metrics.observe_request(
                last.engine, accepted.n, max(r.completion_tokens for r in records)
            )

    async def _complete(self, choices: list[_Choice], accepted: Plan, shape: ResponseShape) -> web.Response:
        async def collect(choice: _Choice) -> Choice:
            texts: list[str] = []
            tokens: list[TokenLogprob] = []
            finish_reason = "length"
            async for output in choice.handle.outputs():
                texts.append(output.text)
                tokens += self._logprobs(choice, shape.kind, output, accepted.top_logprobs) or []
                finish_reason = output.finish_reason or finish_reason
            return Choice(choice.index, "".join(texts), finish_reason, tokens if choice.logprobs else None)

        try:
            done = await asyncio.gather(*(collect(choice) for choice in choices))
        except EngineStopped:
            return _json(error_body("The engine stopped.", 503), status=503)
        self._finished(choices, accepted)
        prompt_tokens = sum(len(prompt) for prompt in accepted.prompts)
        completion_tokens = sum(c.handle.record.completion_tokens for c in choices)
        return _json(shape.complete(done, prompt_tokens, completion_tokens))

    async def _stream(
        self,
        request: web.Request,
        choices: list[_Choice],
        accepted: Plan,
        shape: ResponseShape,
        include_usage: bool,
        continuous_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", **_COMMON_HEADERS}
        )
        await response.prepare(request)
        role_sent = shape.kind != "chat"  # vLLM sends every choice's role with the first output
        stopped = False
        try:
            async for choice, output in _merged(choices):
                if not role_sent:
                    for each in choices:
                        await response.write(sse(shape.role_chunk(each.index)))
                    role_sent = True
                logprobs = self._logprobs(choice, shape.kind, output, accepted.top_logprobs)
                choice.tokens += output.tokens
                running = None
                if continuous_usage:
                    prompt_tokens = len(accepted.prompts[choice.prompt])
                    running = usage(prompt_tokens, choice.tokens)
                chunk = shape.chunk(
                    choice.index,
                    output.text,
                    output.finish_reason,
                    logprobs,
                    choice.text_offset,
                    final=not include_usage,
                    running_usage=running,
                )
                choice.text_offset += sum(len(piece) for piece in output.pieces)
                await response.write(sse(chunk))
            self._finished(choices, accepted)
            if include_usage:
                prompt_tokens = sum(len(prompt) for prompt in accepted.prompts)
                completion_tokens = sum(c.handle.record.completion_tokens for c in choices)
                await response.write(sse(shape.usage_chunk(prompt_tokens, completion_tokens)))
            await response.write(sse("[DONE]"))
        except ConnectionError:
            log.debug("client of %s went away", shape.id)  # the finally in _generate aborts it
        except EngineStopped:
            stopped = True  # the engine crashed or stopped: end the stream without [DONE]
        if stopped:
            log.debug("stream %s cut: the engine stopped", shape.id)
        return response


async def _merged(choices: Sequence[_Choice]) -> AsyncIterator[tuple[_Choice, StepOutput]]:
    """Every choice's outputs as they come. Raises EngineStopped if an engine stops first."""
    queue: asyncio.Queue[tuple[_Choice, StepOutput | BaseException | None]] = asyncio.Queue()

    async def pump(choice: _Choice) -> None:
        try:
            async for output in choice.handle.outputs():
                queue.put_nowait((choice, output))
            queue.put_nowait((choice, None))
        except EngineStopped as exc:
            queue.put_nowait((choice, exc))

    tasks = [asyncio.create_task(pump(choice)) for choice in choices]
    try:
        remaining = len(choices)
        while remaining:
            choice, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield choice, item
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
