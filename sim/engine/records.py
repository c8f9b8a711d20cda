"""Ground truth: what the simulator really did for each request, step by step.

Tests and operators compare what specguard *measured* from ``/metrics`` with this. Times are Unix
seconds, so they line up with scrape timestamps.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One engine step of one request."""

    time: float  # when the step's tokens were emitted
    tokens: int  # tokens served to the client: 1 + accepted, capped by max_tokens / EOS
    accepted: int  # draft tokens accepted, counted as vLLM does (not capped by max_tokens)
    draft_tokens: int  # k in a decode step with speculation; 0 in a prefill step or without it
    text: str  # the step's text: one SSE chunk
    cost: float = 0.0  # seconds the cost model gave the engine step (the step never comes sooner)


@dataclass
class RequestRecord:
    id: str
    prompt_tokens: int
    max_tokens: int  # effective: the request's, else what is left of the context window
    max_tokens_param: int | None  # as the request gave it
    temperature: float
    ignore_eos: bool
    arrival_time: float
    engine: int = 0  # the data-parallel engine that served it
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    completion_tokens: int = 0
    finish_reason: str | None = None  # length | stop | abort; None while running
    scheduled_time: float | None = None  # first admission to the running batch
    first_token_time: float | None = None
    finished_time: float | None = None
    preemptions: int = 0
    token_times: list[float] = field(default_factory=list)  # one per completion token
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def drafts(self) -> int:
        return sum(1 for step in self.steps if step.draft_tokens > 0)

    @property
    def draft_tokens(self) -> int:
        return sum(step.draft_tokens for step in self.steps)

    @property
    def accepted_tokens(self) -> int:
        return sum(step.accepted for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GroundTruthLog:
    """Appends finished requests as JSON lines, off the event loop, in finishing order."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._pending: list[str] = []
        self._wakeup = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._writer(), name="sim-ground-truth")

    def append(self, record: RequestRecord) -> None:
        self._pending.append(json.dumps(record.to_json()) + "\n")
        self._wakeup.set()

    async def close(self) -> None:
        """Write what is pending, then stop (a write in progress is never cut short)."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
            self._task = None
        else:
            await self._flush()

    async def _writer(self) -> None:
        while not (self._closing and not self._pending):
            await self._wakeup.wait()
            await self._flush()

    async def _flush(self) -> None:
        self._wakeup.clear()
        lines, self._pending = self._pending, []
        if lines:
            try:
                await asyncio.to_thread(_append, self._path, "".join(lines))
            except OSError as exc:  # a full disk must not stop serving
                log.error("cannot write ground truth to %s: %s", self._path, exc)


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
