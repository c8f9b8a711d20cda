"""The engine: a scheduler and a step loop shaped like vLLM V1's, with the decoding model inside.

One asyncio task runs steps back to back while there is work. A step admits waiting requests (at
most ``max_num_seqs`` running, and only if their tokens fit the KV cache), sleeps for the step's
cost, then for every running request either prefills (first step after admission: one token, no
draft, as vLLM samples the first token from the prefill) or decodes (k draft tokens, an accepted
prefix, plus the bonus token). Each request's tokens of a step go out as one output, which the HTTP
layer turns into one SSE chunk. Prompt blocks already in the prefix cache (sim.engine.prefix_cache) are not
computed again: they cost no prefill time.

KV cache, simplified (no blocks): a running request holds ``prompt + generated`` tokens; a decode
step needs ``1 + k`` more slots for the tokens it may add (vLLM reserves the lookahead slots too).
When a step would need more than ``kv_capacity_tokens``, the newest running request is preempted
back to the front of the waiting queue, its KV freed; re-admitted, it recomputes its tokens in a
prefill step. The reported usage is held / capacity, floored by an override (``set_kv_usage_floor``
or a scenario ramp) that only changes the gauge, not the scheduling.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from specguard.sim import model
from specguard.sim.engine.events import EngineCounters, EngineListener, EngineStep
from specguard.sim.engine.prefix_cache import PrefixCache, block_hashes
from specguard.sim.engine.records import RequestRecord, StepRecord
from specguard.sim.engine.requests import (
    EngineRequest,
    EngineStopped,
    GenerationParams,
    RequestState,
    RequestStep,
    StepOutput,
)
from specguard.sim.options import SimOptions, check_acceptance
from specguard.sim.tokens import TokenText

log = logging.getLogger(__name__)

MAX_RECORDS = 10_000  # requests kept for ground_truth()


class RequestHandle:
    """One submitted request: its record, its outputs, and a way to abort it."""

    def __init__(self, engine: Engine, request: EngineRequest) -> None:
        self._engine = engine
        self._request = request

    @property
    def id(self) -> str:
        return self._request.record.id

    @property
    def record(self) -> RequestRecord:
        return self._request.record

    async def outputs(self) -> AsyncIterator[StepOutput]:
        """One output per engine step, until the finishing one. Raises EngineStopped."""
        while True:
            output = await self._request.outputs.get()
            if output is None:
                raise EngineStopped("the engine stopped")
            yield output
            if output.finish_reason is not None:
                return

    def abort(self) -> None:
        """The client went away: drop the request (vLLM counts it with finished_reason=abort)."""
        self._engine._abort(self._request)


@dataclass
class _Ramp:
    start: float  # monotonic
    end: float
    start_value: float
    end_value: float

    def at(self, now: float) -> float:
        if now >= self.end or self.end <= self.start:
            return self.end_value
        share = (now - self.start) / (self.end - self.start)
        return self.start_value + (self.end_value - self.start_value) * share


class Engine:
    def __init__(
        self,
        options: SimOptions,
        listener: EngineListener,
        on_record: Callable[[RequestRecord], None] | None = None,
        index: int = 0,
    ) -> None:
        self.options = options
        self.index = index  # among data-parallel engines
        self.k = options.num_speculative_tokens
        self.counters = EngineCounters(accepted_per_position=[0] * self.k)
        self._listener = listener
        self._on_record = on_record
        self._acceptance = list(options.acceptance_by_position)
        self.acceptance_changes: list[tuple[float, list[float]]] = []  # (Unix time, new values)
        self._rng = random.Random(None if options.seed is None else f"{options.seed}/engine{index}")
        self.prefix_cache = PrefixCache(
            options.block_size,
            options.kv_capacity_tokens // options.block_size,
            options.enable_prefix_caching,
        )
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []  # admission order: the last is preempted first
        self._unfinished: set[EngineRequest] = set()
        # Bounded so a simulator left running for days does not grow without end; the ground-truth
        # file keeps every request.
        self._records: deque[RequestRecord] = deque(maxlen=MAX_RECORDS)
        self._sequence = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._floor: _Ramp | None = None
        self._deadline = 0.0
        self._stopped = False
        # Monotonic for durations, shifted to Unix time for records that line up with scrapes.
        self._wall_offset = time.time() - time.monotonic()

    # --- control ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="sim-engine")

    async def stop(self) -> None:
        """Stop stepping. Unfinished requests hear nothing more, as from a dead engine (see release)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def release(self) -> None:
        """End the output of every unfinished request with EngineStopped."""
        self._fail_unfinished()

    def _fail_unfinished(self) -> None:
        for request in self._unfinished:
            request.outputs.put_nowait(None)
        self._unfinished.clear()

    def set_acceptance(self, acceptance: float | Sequence[float]) -> None:
        """Conditional acceptance per draft position at temperature 0 (one value: every position)."""
        self._acceptance = check_acceptance(acceptance)
        # Steps executed from now on draw with the new values: record when, as ground truth.
        self.acceptance_changes.append((self._wall(time.monotonic()), list(self._acceptance)))

    @property
    def acceptance(self) -> list[float]:
        return list(self._acceptance)

    def set_kv_usage_floor(self, floor: float | None) -> None:
        """Report at least ``floor`` as KV-cache usage (None: report the real usage)."""
        self._floor = None if floor is None else _Ramp(0.0, 0.0, floor, _fraction(floor))

    @property
    def kv_usage_floor_ramp(self) -> _Ramp | None:
        """The KV-usage floor in force (a fixed floor is a ramp that has ended), or None."""
        return self._floor

    def ramp_kv_usage_floor(self, to: float, over: float) -> None:
        """Move the floor linearly from its current value to ``to`` in ``over`` seconds."""
        now = time.monotonic()
        current = self._floor.at(now) if self._floor else 0.0
        self._floor = _Ramp(now, now + max(over, 0.0), current, _fraction(to))

    # --- state --------------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_unfinished(self) -> int:
        """Requests submitted and not finished: what the data-parallel router balances."""
        return len(self._unfinished)

    def kv_usage(self) -> float:
        held = sum(request.held_tokens for request in self._running)
        usage = held / self.options.kv_capacity_tokens
        if self._floor is not None:
            usage = max(usage, self._floor.at(time.monotonic()))
        return min(usage, 1.0)

    def records(self) -> list[RequestRecord]:
        """Every request seen so far, in arrival order (unfinished ones have no finish_reason)."""
        return list(self._records)

    # --- requests -----------------------------------------------------------------------------------

    def submit(self, params: GenerationParams) -> RequestHandle:
        """Queue a request. Its outputs come from the handle."""
        if self._stopped:
            raise EngineStopped("the engine is stopped")
        max_tokens = params.max_tokens or self.options.max_model_len - params.prompt_tokens
        if params.prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("a request needs >= 1 prompt token and room for >= 1 completion token")
        if params.prompt_token_ids and len(params.prompt_token_ids) != params.prompt_tokens:
            raise ValueError("prompt_token_ids must hold prompt_tokens ids")
        self._sequence += 1
        seed = f"{self.options.seed}/{self.index}/{self._sequence}" if self.options.seed is not None else None
        text_rng = random.Random(seed)
        record = RequestRecord(
            id=params.request_id or uuid.uuid4().hex,
            prompt_tokens=params.prompt_tokens,
            max_tokens=max_tokens,
            max_tokens_param=params.max_tokens,
            temperature=params.temperature,
            ignore_eos=params.ignore_eos,
            arrival_time=self._wall(time.monotonic()),
            engine=self.index,
        )
        hashes = block_hashes(params.prompt_token_ids, self.options.block_size)
        eos_at = model.natural_length(text_rng, self.options.mean_output_tokens)
        if not params.ignore_eos and eos_at <= max_tokens:
            request = EngineRequest(record, eos_at, "stop", TokenText(text_rng), hashes)
        else:
            request = EngineRequest(record, max_tokens, "length", TokenText(text_rng), hashes)
        request.acceptance_factor = model.request_factor(
            self._rng, self._acceptance[0], self.options.acceptance_spread
        )
        self._unfinished.add(request)
        self._records.append(record)
        self._waiting.append(request)
        self._wakeup.set()
        return RequestHandle(self, request)

    def _abort(self, request: EngineRequest) -> None:
        if request.state is RequestState.FINISHED:
            return
        if request.state is RequestState.WAITING:
            self._waiting.remove(request)
        else:
            self._running.remove(request)
        self._finish(request, "abort", self._wall(time.monotonic()))

    # --- the step loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        try:
            await self._steps()
        except Exception:
            log.exception("the simulated engine crashed")
            self._stopped = True
            self._fail_unfinished()
            raise

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            self._schedule()
            batch = list(self._running)
            if not batch:  # nothing fits yet (cannot happen with valid options); try next step
                await asyncio.sleep(self.options.step_time)
                continue
            prefill = sum(r.held_tokens - r.cached_tokens for r in batch if r.needs_prefill)
            cost = model.step_seconds(
                self.options.step_time,
                self.k,
                self.options.draft_cost,
                self.options.batch_slowdown,
                len(batch),
                prefill,
                self.options.prefill_tokens_per_step,
                self.options.verify_token_cost,
            )
            # Steps follow each other on a fixed cadence: small sleep overshoots do not add up,
            # but after idling or falling far behind the cadence restarts from now.
            now = loop.time()
            start = self._deadline if 0 <= now - self._deadline < cost else now
            self._deadline = start + cost
            await asyncio.sleep(max(self._deadline - loop.time(), 0.0))
            self._execute(batch, cost)

    def _needed(self, requests: Sequence[EngineRequest]) -> int:
        # Tokens held plus what this step may add: 1 + k in decode, the sampled token in prefill.
        return sum(r.held_tokens + (1 if r.needs_prefill else 1 + self.k) for r in requests)

    def _schedule(self) -> None:
        capacity = self.options.kv_capacity_tokens
        # The last request standing is never preempted: options guarantee one always fits.
        preempted = False
        while len(self._running) > 1 and self._needed(self._running) > capacity:
            self._preempt(self._running.pop())
            preempted = True
        if preempted:
            return  # as vLLM's scheduler: no admissions in a step that had to preempt
        while self._waiting and len(self._running) < self.options.max_num_seqs:
            candidate = self._waiting[0]
            if self._running and self._needed([*self._running, candidate]) > capacity:
                break  # waits for capacity (num_requests_waiting_by_reason{reason="capacity"})
            self._waiting.popleft()
            candidate.state = RequestState.RUNNING
            candidate.needs_prefill = True
            candidate.cached_tokens = 0  # a preempted request recomputes what it held
            if candidate.record.scheduled_time is None:
                candidate.record.scheduled_time = self._wall(time.monotonic())
                # Looked up once, when first scheduled (a re-admission after preemption is not
                # counted again in vLLM's prefix-cache metrics).
                candidate.cached_tokens = self.prefix_cache.lookup(
                    candidate.block_hashes, candidate.record.prompt_tokens
                )
                candidate.record.cached_tokens = candidate.cached_tokens
            self._running.append(candidate)

    def _preempt(self, request: EngineRequest) -> None:
        request.state = RequestState.WAITING
        request.record.preemptions += 1
        self.counters.preemptions += 1
        self._waiting.appendleft(request)  # vLLM puts preempted requests first in line
        self._listener.on_preempted(self.index, request.record)

    def _execute(self, batch: Sequence[EngineRequest], cost: float = 0.0) -> None:
        wall = self._wall(time.monotonic())
        outputs: list[RequestStep] = []
        finished: list[tuple[EngineRequest, str]] = []
        prompt_tokens = 0
        cached_tokens = 0
        for request in batch:
            if request.state is not RequestState.RUNNING:  # aborted while the step ran
                continue
            record = request.record
            first_token = record.first_token_time is None
            if request.needs_prefill:
                request.needs_prefill = False
                draft_tokens, accepted = 0, 0
                if first_token:
                    prompt_tokens += record.prompt_tokens
                    cached_tokens += request.cached_tokens
                    self.prefix_cache.insert(request.block_hashes, self._free_blocks())
            else:
                draft_tokens = self.k
                accepted = self._sample(record.temperature, request.acceptance_factor) if self.k else 0
            tokens = min(1 + accepted, request.stop_at - record.completion_tokens)
            done = record.completion_tokens + tokens >= request.stop_at
            pieces = [request.text.next() for _ in range(tokens)]
            if done and request.stop_reason == "stop":
                pieces[-1] = ""  # the EOS token counts as a completion token but has no text
            step = StepRecord(wall, tokens, accepted, draft_tokens, "".join(pieces), cost)
            interval = None if first_token else wall - record.token_times[-1]
            record.steps.append(step)
            record.token_times.extend([wall] * tokens)
            record.completion_tokens += tokens
            if first_token:
                record.first_token_time = wall
            self._count(step)
            outputs.append(RequestStep(record, step, first_token, interval))
            reason = request.stop_reason if done else None
            request.outputs.put_nowait(StepOutput(step.text, tokens, reason, tuple(pieces)))
            if reason is not None:
                finished.append((request, reason))
        self.counters.steps += 1
        self.counters.prompt_tokens += prompt_tokens
        self.counters.cached_prompt_tokens += cached_tokens
        self._listener.on_step(EngineStep(self.index, prompt_tokens, cached_tokens, outputs))
        for request, reason in finished:
            self._running.remove(request)
            self._finish(request, reason, wall)

    def _sample(self, temperature: float, factor: float = 1.0) -> int:
        conditional = model.acceptance_at(
            self._acceptance, self.k, temperature, self.options.temperature_decay
        )
        if factor != 1.0:
            conditional = [min(1.0, a * factor) for a in conditional]
        return model.sample_accepted(self._rng, conditional)

    def _count(self, step: StepRecord) -> None:
        counters = self.counters
        counters.generation_tokens += step.tokens
        if step.draft_tokens > 0:  # vLLM counts a draft only when the step had draft tokens
            counters.num_drafts += 1
            counters.num_draft_tokens += step.draft_tokens
            counters.num_accepted_tokens += step.accepted
            for position in range(step.accepted):
                counters.accepted_per_position[position] += 1

    def _finish(self, request: EngineRequest, reason: str, wall: float) -> None:
        request.state = RequestState.FINISHED
        record = request.record
        record.finish_reason = reason
        record.finished_time = wall
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1
        self._listener.on_finished(self.index, record)
        if self._on_record is not None:
            self._on_record(record)
        self._unfinished.discard(request)

    def _free_blocks(self) -> int:
        block = self.options.block_size
        used = sum(-(-request.held_tokens // block) for request in self._running)
        return self.prefix_cache.num_blocks - used

    def _wall(self, monotonic: float) -> float:
        return monotonic + self._wall_offset


def _fraction(value: float) -> float:
    if not 0 <= value <= 1:
        raise ValueError(f"a KV-cache usage is a fraction in [0, 1], got {value!r}")
    return value
