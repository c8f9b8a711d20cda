"""The actions as a backtest runs them: through the real dispatcher and guards, changing nothing.

A feature flag is the real action, its controller and its journal, writing to a flag held in memory
instead of a file, an API or the router (and without its canary: the canary probes a live server,
so a replayed restore passes it). Every other action is rehearsed: a run succeeds at once and says
what it would have done (logged, posted, vLLM restarted from k to the ladder's next step), so the
guards (cooldown, budget, silences, dedup) decide on the runs as they would live. What a rehearsal
cannot know is how the world answers: a restart that fails its verification, a Slack outage, a
canary that keeps the fallback. Those are the action's own tests' concern, not a rule's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specguard.actions.base import Action, ActionContext, Outcome
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.actions.feature_flag.backends import matches
from specguard.actions.vllm_restart.params import VllmRestartParams

LADDER_KEY = "rehearsed_k"  # the k a rehearsed ladder has stepped to, in its memory


class MemoryFlag:
    """A feature flag's backend that holds the value it was last set to."""

    confirms = True

    def __init__(self) -> None:
        self.value: Any = None
        self.changes: list[str] = []

    async def set(self, value: Any, what: str) -> str:
        self.value = value
        self.changes.append(what)
        return f"the flag would be set ({what})"

    async def read(self, engage: Any, restore: Any) -> str | None:
        if self.value is None:
            return None
        if matches(self.value, engage):
            return "engaged"
        return "restored" if matches(self.value, restore) else None


class Rehearsal(Action):
    """An action's stand-in: the same name, parameters (its cooldown and budget) and kind."""

    def __init__(self, real: Action) -> None:
        super().__init__(real.name, real.params)
        self.real = real

    @property
    def restores(self) -> bool:
        return self.real.restores

    @property
    def restore_delay(self) -> float:
        return self.real.restore_delay

    async def run(self, ctx: ActionContext) -> Outcome:
        if isinstance(self.params, VllmRestartParams):
            return await self._step(ctx, down=True)
        if self.type == "log":
            return Outcome(True, f"would log: {ctx.summary}")
        if self.type == "slack":
            return Outcome(True, f"would post to Slack: {ctx.summary}")
        return Outcome(True, f"would run {self.type}")

    async def restore(self, ctx: ActionContext) -> Outcome:
        if isinstance(self.params, VllmRestartParams):
            return await self._step(ctx, down=False)
        return Outcome(True, f"would restore ({self.type})")

    async def _step(self, ctx: ActionContext, down: bool) -> Outcome:
        """A ladder's step, from the k it was last rehearsed at (its first rung at the start)."""
        assert isinstance(self.params, VllmRestartParams)
        ladder = self.params.ladder
        if ctx.event != "firing" and down:
            return Outcome(True, "nothing to do when the rule resolves")
        moved: dict[str, Any] = {}

        def step(current: Any) -> Any:
            k = int(current) if isinstance(current, int) else ladder[0]
            at = ladder.index(k) if k in ladder else 0
            to = at + 1 if down else at - 1
            moved["from"] = k
            moved["to"] = ladder[to] if 0 <= to < len(ladder) else k
            return moved["to"]

        await self.memory(ctx).update(LADDER_KEY, step)
        if moved["from"] == moved["to"]:
            end = "last" if down else "first"
            return Outcome(True, f"k is at the ladder's {end} step ({moved['to']}): nothing to do")
        return Outcome(True, f"would restart vLLM with k {moved['from']} -> {moved['to']}")


def rehearsed(actions: Mapping[str, Action]) -> dict[str, Action]:
    """The config's actions as the backtest runs them."""
    out: dict[str, Action] = {}
    for name, real in actions.items():
        if isinstance(real, FeatureFlagAction):
            real.backend = MemoryFlag()
            real.canary = None
            real.drains = []
            real.fleet = None
            real.read_every = 0.0
            out[name] = real
            continue
        kind = type(
            f"Rehearsed{type(real).__name__}",
            (Rehearsal,),
            {"type": real.type, "changes_world": real.changes_world},
        )
        out[name] = kind(real)
    return out
