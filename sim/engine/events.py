"""What the engine reports of its steps: events for its listener (sim.metrics) and its own totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specguard.sim.engine.records import RequestRecord
from specguard.sim.engine.requests import RequestStep


@dataclass(frozen=True)
class EngineStep:
    engine: int  # the engine's index (vLLM's `engine` label)
    prompt_tokens: int  # prompt tokens prefilled for the first time in this step
    cached_tokens: int  # ...of which found in the prefix cache (not computed)
    outputs: Sequence[RequestStep]

    @property
    def generated_tokens(self) -> int:
        return sum(out.step.tokens for out in self.outputs)


class EngineListener(Protocol):
    """Who turns engine events into metrics (sim.metrics.VllmMetrics)."""

    def on_step(self, step: EngineStep) -> None: ...

    def on_finished(self, engine: int, record: RequestRecord) -> None: ...

    def on_preempted(self, engine: int, record: RequestRecord) -> None: ...


@dataclass
class EngineCounters:
    """Python-side totals, to compare with what /metrics says."""

    steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason
