"""A request in the engine: what it is submitted with, what the engine holds of it, and what each
step sends it (sim.engine.engine runs the steps)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from specguard.sim.engine.records import RequestRecord, StepRecord
from specguard.sim.tokens import TokenText


@dataclass(frozen=True)
class GenerationParams:
    prompt_tokens: int
    max_tokens: int | None = None  # None: the rest of the context window, as vLLM does
    temperature: float = 1.0
    ignore_eos: bool = False
    request_id: str | None = None
    # The prompt's token ids, for the prefix cache; empty: a prompt that shares nothing.
    prompt_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepOutput:
    """The tokens one step produced for one request."""

    text: str
    tokens: int
    finish_reason: str | None  # set on the request's last output
    pieces: tuple[str, ...] = ()  # the text of each token


class EngineStopped(Exception):
    """The engine stopped (simulator shut down or died) before the request finished."""


@dataclass(frozen=True)
class RequestStep:
    record: RequestRecord
    step: StepRecord
    first_token: bool
    interval: float | None  # since the request's previous output (an inter-token latency)


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class EngineRequest:
    """A request as the engine holds it: its record, where it stands, and its queue of outputs."""

    def __init__(
        self,
        record: RequestRecord,
        stop_at: int,
        stop_reason: str,
        text: TokenText,
        block_hashes: Sequence[int],
    ) -> None:
        self.record = record
        self.block_hashes = block_hashes
        self.stop_at = stop_at  # completion tokens at which the request ends
        self.stop_reason = stop_reason  # "stop" (EOS) or "length" (max_tokens)
        self.text = text
        self.state = RequestState.WAITING
        self.needs_prefill = True
        self.cached_tokens = 0  # prompt tokens the prefix cache holds for the coming prefill
        self.outputs: asyncio.Queue[StepOutput | None] = asyncio.Queue()
        self.acceptance_factor = 1.0  # this request's acceptance over the configured one

    @property
    def held_tokens(self) -> int:
        return self.record.prompt_tokens + self.record.completion_tokens
