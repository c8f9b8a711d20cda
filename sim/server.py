"""The simulator's HTTP side: vLLM's endpoints in front of the simulated engine.

Like vLLM, the port is not bound until "loading" (``startup_delay``) is over, so a client sees
connection refused, never a "loading" status; and a dead simulator (scenario ``die``) closes the
port and cuts in-flight streams, as a vLLM whose engine died does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Literal

from aiohttp import web

from sim.engine import Engine, EngineStopped, GenerationParams, RequestHandle
from sim.metrics import VllmMetrics
from sim.options import SimOptions
from sim.protocol import (
    VLLM_VERSION,
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    ResponseShape,
    error_body,
    models_body,
    parse_request,
    sse,
)
from sim.records import GroundTruthLog, RequestRecord
from sim.scenario import run_scenario

log = logging.getLogger(__name__)

# How long a stop waits for in-flight requests before cutting them. The engine stops first, so no
# stream can finish anyway: keep it short.
SHUTDOWN_GRACE = 0.2

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: object, status: int = 200) -> web.Response:
    # Compact, as FastAPI's JSONResponse writes it.
    return web.Response(
        text=json.dumps(body, separators=(",", ":")), status=status, content_type="application/json"
    )


class Simulator:
    """A running simulator. Built by :func:`start_simulator`."""

    def __init__(
        self,
        options: SimOptions,
        engine: Engine,
        metrics: VllmMetrics,
        runner: web.AppRunner,
        port: int,
        ground_truth_log: GroundTruthLog | None,
    ) -> None:
        self.options = options
        self.engine = engine
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

    def ground_truth(self) -> list[RequestRecord]:
        """Every request so far (the last 10,000), in arrival order."""
        return self.engine.records()

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
                run_scenario(scenario, self.engine, self._die), name="sim-scenario"
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
        await self.engine.stop()
        await self._runner.cleanup()
        self.engine.release()  # anything still waiting outside HTTP hears the engine stopped
        if self._log is not None:
            await self._log.close()
        self._closed.set()


async def start_simulator(options: SimOptions) -> Simulator:
    """Load (sleep ``startup_delay``), bind, start the engine and scenario; return once listening."""
    if options.startup_delay > 0:
        await asyncio.sleep(options.startup_delay)
    metrics = VllmMetrics(options)
    ground_truth_log = GroundTruthLog(options.ground_truth_file) if options.ground_truth_file else None
    engine = Engine(options, metrics, ground_truth_log.append if ground_truth_log else None)
    metrics.attach(engine)
    app = build_app(options, engine, metrics)
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
    engine.start()
    simulator = Simulator(options, engine, metrics, runner, port, ground_truth_log)
    simulator._start_scenario()
    return simulator


def build_app(options: SimOptions, engine: Engine, metrics: VllmMetrics) -> web.Application:
    api = _Api(options, engine, metrics)
    app = web.Application(middlewares=[api.middleware])
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/health", api.health)
    app.router.add_get("/version", api.version)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/load", api.load)
    app.router.add_route("*", "/ping", api.health)  # SageMaker's health check, GET or POST
    app.router.add_get("/sim/ground-truth", api.ground_truth)
    return app


class _Api:
    def __init__(self, options: SimOptions, engine: Engine, metrics: VllmMetrics) -> None:
        self.options = options
        self.engine = engine
        self.vllm_metrics = metrics
        self.started = int(time.time())

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """FastAPI-style errors (never a traceback) and the instrumentator's HTTP metrics."""
        started = time.perf_counter()
        resource = request.match_info.route.resource
        handler_name = resource.canonical if resource is not None else "none"
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # the router's 404 / 405
            response = _json({"detail": exc.reason}, status=exc.status)
        except Exception:
            log.exception("error serving %s %s", request.method, request.path)
            response = _json(error_body("Internal server error", 500), status=500)
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

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VLLM_VERSION})

    async def load(self, request: web.Request) -> web.Response:
        return _json({"server_load": self.engine.num_running + self.engine.num_waiting})

    async def metrics(self, request: web.Request) -> web.Response:
        # Rendered on the event loop, between engine steps: a scrape never sees half a step.
        body, content_type = self.vllm_metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def ground_truth(self, request: web.Request) -> web.Response:
        return _json([record.to_json() for record in self.engine.records()])

    # --- generation ---------------------------------------------------------------------------------

    async def _generate(
        self, request: web.Request, kind: Literal["chat", "completion"]
    ) -> web.StreamResponse:
        try:
            handle, shape, stream, include_usage = self._admit(kind, await request.read())
        except RequestError as exc:
            return _json(exc.body, status=exc.status)
        except EngineStopped:
            return _json(error_body("The engine is not running.", 503), status=503)
        try:
            if stream:
                return await self._stream(request, handle, shape, include_usage)
            return await self._complete(handle, shape)
        finally:
            handle.abort()  # a no-op once finished; otherwise the client left or we are stopping

    def _admit(
        self, kind: Literal["chat", "completion"], raw: bytes
    ) -> tuple[RequestHandle, ResponseShape, bool, bool]:
        body = parse_request(ChatCompletionRequest if kind == "chat" else CompletionRequest, raw)
        served = self.options.model
        if body.model is not None and body.model != served:
            raise RequestError(f"The model `{body.model}` does not exist.", 404, "model")
        prompt_tokens = body.prompt_tokens()
        max_tokens = body.requested_max_tokens()
        limit = self.options.max_model_len
        if prompt_tokens >= limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
                param="messages" if kind == "chat" else "prompt",
            )
        if max_tokens is not None and prompt_tokens + max_tokens > limit:
            raise RequestError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {limit} tokens and your request has {prompt_tokens} input tokens "
                f"({max_tokens} > {limit} - {prompt_tokens}).",
                param="max_tokens",
            )
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        request_id = prefix + uuid.uuid4().hex[:16]
        handle = self.engine.submit(
            GenerationParams(
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                temperature=body.effective_temperature,
                ignore_eos=body.ignore_eos,
                request_id=request_id,
            )
        )
        return handle, ResponseShape(kind, request_id, served), bool(body.stream), body.include_usage

    async def _complete(self, handle: RequestHandle, shape: ResponseShape) -> web.Response:
        texts: list[str] = []
        finish_reason = "length"
        try:
            async for output in handle.outputs():
                texts.append(output.text)
                finish_reason = output.finish_reason or finish_reason
        except EngineStopped:
            return _json(error_body("The engine stopped.", 503), status=503)
        record = handle.record
        return _json(
            shape.complete("".join(texts), finish_reason, record.prompt_tokens, record.completion_tokens)
        )

    async def _stream(
        self, request: web.Request, handle: RequestHandle, shape: ResponseShape, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        role = shape.role_chunk()
        try:
            async for output in handle.outputs():
                if role is not None:  # vLLM sends the role with the first output
                    await response.write(sse(role))
                    role = None
                await response.write(sse(shape.chunk(output.text, output.finish_reason)))
            if include_usage:
                record = handle.record
                await response.write(sse(shape.usage_chunk(record.prompt_tokens, record.completion_tokens)))
            await response.write(sse("[DONE]"))
        except ConnectionError:
            log.debug("client of %s went away", handle.id)  # the finally in _generate aborts it
        except EngineStopped:
            pass  # the engine crashed or stopped: end the stream without [DONE]
        return response
