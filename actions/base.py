"""The one small interface every action implements.

An action does one thing, idempotently, within a timeout, and reports an outcome. Actions that
change the world can undo it (``restore``). The dispatcher owns retries, guards and recording.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rules.durations import Duration


class ActionParams(BaseModel):
    """Parameters every action accepts; each action extends this with its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    timeout: Duration = Field(30.0, gt=0)


@dataclass(frozen=True)
class ActionContext:
    """What an action knows about the event it runs for."""

    rule: str
    event: str  # firing | resolved
    severity: str
    labels: Mapping[str, str]
    value: float | None
    threshold: float | None
    summary: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    event_id: int | None = None


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str = ""


class Action(ABC):
    """Base class: subclasses set ``type`` and ``Params`` and implement ``run``."""

    type: ClassVar[str]
    Params: ClassVar[builtins.type[ActionParams]] = ActionParams

    def __init__(self, name: str, params: ActionParams):
        self.name = name
        self.params = params

    @property
    def timeout(self) -> float:
        return self.params.timeout

    @abstractmethod
    async def run(self, ctx: ActionContext) -> Outcome:
        """Do the thing. Must be idempotent: a run may be repeated after a crash."""

    async def restore(self, ctx: ActionContext) -> Outcome:
        """Undo what ``run`` changed. Actions that change nothing have nothing to undo."""
        return Outcome(True, "nothing to restore")
