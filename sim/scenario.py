"""Scenario files: a timeline of changes applied to a running simulator.

```yaml
timeline:
  - at: 60s
    acceptance: 0.2                     # or acceptance_by_position: [0.9, 0.5]
  - at: 90s
    kv_usage: {to: 0.98, over: 30s}     # ramp the reported KV-cache usage floor; `kv_usage: 0.5` jumps
  - at: 120s
    engine: 1                           # with --data-parallel-size: this engine only (default: all)
    kv_usage: 0.99
  - at: 300s
    die: true                           # stop answering: the port closes, streams are cut
```

Times are relative to the moment the simulator starts serving (after its startup delay). Errors
are reported as ``file:line: field: message``. This module reads and checks the file;
sim.scenario_player plays its timeline on the engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specguard.common.yamlfile import FileProblems, Problem, load_yaml, validation_problems
from specguard.rules.durations import Duration

Probability = Annotated[float, Field(ge=0, le=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KvRamp(_Strict):
    to: Probability
    over: Duration = 0.0


class TimelineEvent(_Strict):
    at: Duration
    engine: int | None = Field(None, ge=0)  # None: every engine
    acceptance: Probability | None = None
    acceptance_by_position: list[Probability] | None = Field(None, min_length=1)
    kv_usage: Probability | KvRamp | None = None
    die: bool = False

    @model_validator(mode="after")
    def _one_change(self) -> TimelineEvent:
        if self.acceptance is not None and self.acceptance_by_position is not None:
            raise ValueError("give `acceptance` or `acceptance_by_position`, not both")
        if self.die and self.engine is not None:
            raise ValueError("`die` stops the whole server: it takes no `engine`")
        if (
            self.acceptance is None
            and self.acceptance_by_position is None
            and self.kv_usage is None
            and not self.die
        ):
            raise ValueError(
                "an event changes something: acceptance, acceptance_by_position, kv_usage or die"
            )
        return self


class Scenario(_Strict):
    description: str = ""
    timeline: list[TimelineEvent] = Field(min_length=1)

    @model_validator(mode="after")
    def _in_order(self) -> Scenario:
        times = [event.at for event in self.timeline]
        if times != sorted(times):
            raise ValueError("timeline events must be in order of `at`")
        return self


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file. Raises FileProblems."""
    label = str(path)
    data = load_yaml(path, label=label)
    if not isinstance(data, dict):
        raise FileProblems(
            [
                Problem(
                    label, getattr(data, "line", None), "", "a scenario is a mapping with a `timeline:` list"
                )
            ]
        )
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise FileProblems(validation_problems(label, data, exc)) from None
