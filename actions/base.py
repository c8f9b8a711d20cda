"""The one small interface every action implements.

An action does one thing, idempotently, within a timeout, and reports an outcome. Actions that
change the world (``changes_world``) can undo it: the dispatcher calls ``restore`` for them, not
``run``, once the rule has resolved and stayed so for ``restore_delay``. The dispatcher owns
guards, scheduling and recording; an action keeps what it must remember (a flag's holders, a Slack
thread) in its ``memory``, which the store keeps, and says what it holds in the world now (a
fallback engaged, vLLM's number of speculative tokens) through ``holding``, for the daemon's own
metrics.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from specguard.coordination.gate import FleetGate
from specguard.rules.durations import Duration
from specguard.store.records import RunOutcome


class Budget(BaseModel):
    """``budget: {runs: 2, per: 1h}``: at most this many runs in any such window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: int = Field(ge=1)
    per: Duration = Field(gt=0)


class ActionParams(BaseModel):
    """Parameters every action accepts; each action extends this with its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    timeout: Duration = Field(30.0, gt=0)
    # Guards (between the dispatcher and the action): a series' firing is acted on at most once
    # per ``cooldown``, and the action runs at most ``budget.runs`` times per ``budget.per``.
    cooldown: Duration = Field(0.0, ge=0)
    budget: Budget | None = None


class ActionMemory(Protocol):
    """What one action keeps between runs and restarts: JSON values by key, in the store."""

    async def read(self, key: str) -> Any:
        """The value stored under ``key``, or None."""
        ...

    async def update(
        self,
        key: str,
        change: Callable[[Any], Any],
        notes: Callable[[], Sequence[tuple[int, str]]] | None = None,
    ) -> Any:
        """Store ``change(current)`` (current: None when there is none) and return it, as one
        transaction: two updates never interleave. ``notes()``, called after ``change``, gives
        lines for ``specguard history`` as (event id, text), written in the same transaction."""
        ...

    def of(self, action: str) -> ActionMemory:
        """Another action's memory, in the same store (a drain holds a feature flag)."""
        ...


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
    series: str = ""  # the series' key, as the store spells it
    at: float | None = None  # when the event happened (unix time)
    since: float | None = None  # a firing's: when the breach that fired it began
    memory: ActionMemory | None = None
    # What the event's other actions did before this one ran (for actions that tell of them).
    outcomes: tuple[RunOutcome, ...] = ()


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str = ""
    # A restore that could not be done yet (a canary that failed): try again after this many
    # seconds. None: the outcome is final.
    retry_after: float | None = None
    # On-call must hear of it now, even when the run is not over (a restart deferred because the
    # fleet's store cannot be reached) or went well (a step done after its fleet slot had ended).
    page: bool = False


@dataclass(frozen=True)
class Holding:
    """What an action holds in the world now, as its memory says; the daemon shows it on its
    ``/metrics``. None: the action holds nothing of that kind, or does not know."""

    fallback_engaged: bool | None = None  # a feature flag's fallback to standard decoding is on
    speculative_tokens: int | None = None  # vLLM's num_speculative_tokens (0: speculation off)


class Action(ABC):
    """Base class: subclasses set ``type`` and ``Params`` and implement ``run``."""

    type: ClassVar[str]
    Params: ClassVar[builtins.type[ActionParams]] = ActionParams
    # Whether the action changes the world (and ``restore`` undoes it) or only tells of the event.
    changes_world: ClassVar[bool] = False
    # Whether it wants to hear how the other actions' runs ended (``observe``, ``ctx.outcomes``).
    observes: ClassVar[bool] = False
    # Whether a run may take minutes (a restart): the dispatcher then carries it out beside the
    # rest, so that nothing else (an evaluation, a notice, the daemon's start) waits for it.
    long_running: ClassVar[bool] = False
    # Whether what the action holds is derived from the rules' states on every tick by a
    # controller (the feature flag: engaged while an eligible series fires), rather than run
    # once per event: the dispatcher plans no runs for it; its controller writes them.
    reconciled: ClassVar[bool] = False

    def __init__(self, name: str, params: ActionParams):
        """Raises ValueError when the action cannot be set up (a secret it cannot read)."""
        self.name = name
        self.params = params

    @property
    def timeout(self) -> float:
        return self.params.timeout

    @property
    def restores(self) -> bool:
        """Whether a resolution calls ``restore`` (after ``restore_delay``)."""
        return self.changes_world

    @property
    def restore_delay(self) -> float:
        """How long a rule must stay resolved before ``restore`` is called."""
        return 0.0

    def uses(self) -> tuple[str, ...]:
        """The names of the config's other actions this one uses (a drain's feature flag)."""
        return ()

    def connect(self, actions: Mapping[str, Action]) -> None:
        """Called once every action of the config is built: an action that uses another (a drain
        through a feature flag) finds it here. Raises ValueError when it is not there."""
        return None

    def coordinate(self, fleet: FleetGate, memory: ActionMemory) -> None:
        """Called by the daemon when the config has a ``coordination:`` section: an action that
        disrupts (a restart, a fallback on shared capacity) takes a slot of the fleet's semaphore
        through ``fleet`` first. Others ignore it."""
        return None

    def memory(self, ctx: ActionContext) -> ActionMemory:
        if ctx.memory is None:
            raise RuntimeError(f"action {self.name} needs the store, and was run without one")
        return ctx.memory

    @abstractmethod
    async def run(self, ctx: ActionContext) -> Outcome:
        """Do the thing. Must be idempotent: a run may be repeated after a crash."""

    async def restore(self, ctx: ActionContext) -> Outcome:
        """Undo what ``run`` changed. Actions that change nothing have nothing to undo."""
        return Outcome(True, "nothing to restore")

    async def holding(self, memory: ActionMemory) -> Holding:
        """What the action holds now, from its memory. Only reads: the daemon calls it at start
        and whenever the action's memory changed, whoever changed it (a run, a step by hand)."""
        return Holding()

    async def state(self, memory: ActionMemory) -> dict[str, Any]:
        """What ``/api/status`` shows of the action beside the rules (a notifier's backlog and its
        last error, say), as JSON values; empty: nothing to show. Only reads."""
        return {}

    async def observe(self, outcome: RunOutcome, memory: ActionMemory) -> None:
        """Another action's run ended (a restore after its quiet period, say): for ``observes``."""
        return None

    async def tick(self, memory: ActionMemory) -> float | None:
        """Work of its own that is due (an outbox to deliver); returns when it next has some
        (unix time), or None. The dispatcher calls it then, and after every run."""
        return None
