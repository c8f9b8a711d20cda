"""The ``vllm_restart`` action: fewer speculative tokens, one rung of a ladder at a time.

Each firing steps one rung down the ``ladder`` (e.g. ``[5, 3, 1, 0]``; 0 is speculative decoding
off): the new config is written where vLLM reads it (an environment file, or vLLM's own YAML
``--config`` file edited in place), vLLM is restarted (``systemctl restart UNIT`` or a command),
and the change is verified: ``/health`` answers 200 within ``health_timeout`` and, after a few
requests, ``/metrics`` counts exactly the new number of draft positions (none when off). A change
that fails is rolled back: the previous file, another restart, the old k verified.

A start that fails (vLLM refusing the new config) ends the wait for ``/health`` at once, not after
``health_timeout``: with ``unit``, as soon as ``systemctl show`` says the unit failed, is inactive,
or is being started again by systemd after a failure (``Restart=``); with ``command``, which must
return once it has asked for the restart (a command that stays up as the server outlives
``command_timeout`` and fails the step), as soon as the optional ``status_command`` exits non-zero
(0 while the server's process runs, loading included; its output is quoted as the reason). The
rollback's wait is watched the same way. Without ``status_command``, only ``/health`` and the
timeout tell.

Stepping up is explicit (``specguard ladder up``), or, with ``step_up_after``, one rung once the
rule has stayed resolved that long. Every step is journaled in the store before it is taken: a
daemon that dies mid-restart finds the unfinished change when it starts again and completes the
verification, or rolls back. The steps of a change, and its journal, are in ``change``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Holding, Outcome
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.actions.vllm_restart import speculative
from specguard.actions.vllm_restart.change import (
    SHOWN_CHANGE,
    STATE_KEY,
    ChangeSteps,
    answer_key,
    empty_state,
)
from specguard.actions.vllm_restart.params import EnvFile as EnvFile
from specguard.actions.vllm_restart.params import VllmConfigFile as VllmConfigFile
from specguard.actions.vllm_restart.params import VllmRestartParams as VllmRestartParams
from specguard.actions.vllm_restart.server import Server
from specguard.common.files import read_or_none
from specguard.common.locks import named_lock
from specguard.common.secrets import read_if_given
from specguard.coordination.gate import FleetGate

log = logging.getLogger("specguard.action.vllm_restart")


class VllmRestartAction(ChangeSteps, Action):
    type = "vllm_restart"
    Params = VllmRestartParams
    changes_world = True
    long_running = True

    def __init__(self, name: str, params: ActionParams) -> None:
        super().__init__(name, params)
        assert isinstance(params, VllmRestartParams)
        self.p = params
        token = read_if_given(params.token, f"actions.{name}.token")
        self.server = Server(params.url, token, max_response_size=params.max_response_size)
        self.path = params.env_file.path if params.env_file is not None else params.vllm_config.path  # type: ignore[union-attr]
        self.restart_argv = (
            ("systemctl", "--no-ask-password", "restart", params.unit)
            if params.unit is not None
            else tuple(params.command or ())
        )
        self._drain: FeatureFlagAction | None = None
        self.fleet: FleetGate | None = None

    def coordinate(self, fleet: FleetGate, memory: ActionMemory) -> None:
        self.fleet = fleet  # a restart takes a slot of the fleet's restarts semaphore first

    def uses(self) -> tuple[str, ...]:
        return () if self.p.drain is None else (self.p.drain,)

    def connect(self, actions: Mapping[str, Action]) -> None:
        if self.p.drain is None:
            return
        found = actions.get(self.p.drain)
        if not isinstance(found, FeatureFlagAction):
            raise ValueError(f"drain: {self.p.drain!r} is not a feature_flag action of this config")
        self._drain = found
        found.drains.append(self)  # the flag's controller keeps it engaged while draining() says so

    async def draining(self, memory: ActionMemory) -> str | None:
        """Why the drain holds the flag now: a change under way (its journal open), or a rollback
        that failed (vLLM needs a hand; a step by hand that works lets go). Derived from the
        journal, so a crash anywhere never leaves the flag held for a change that is over."""
        state = await memory.read(STATE_KEY) or {}
        change = state.get("change")
        if change is not None:
            return f"k {change['from']} -> {change['to']} under way"
        if state.get("drain_kept"):
            return "its last change could not be rolled back: vLLM needs a hand"
        return None

    @property
    def _lock(self) -> asyncio.Lock:
        """One change of a vLLM at a time, across config reloads (which build new instances)."""
        return named_lock(f"vllm_restart:{self.name}")

    @property
    def busy(self) -> bool:
        """A change (by a firing, by hand, or resumed) is under way."""
        return self._lock.locked()

    @property
    def restores(self) -> bool:
        return self.p.step_up_after is not None

    @property
    def restore_delay(self) -> float:
        return self.p.step_up_after or 0.0

    # --- the rule's side: a firing steps down, a long enough resolution steps up -----------------

    async def run(self, ctx: ActionContext) -> Outcome:
        if ctx.event != "firing":  # the dispatcher plans none; a resolution never steps down
            return Outcome(True, "nothing to do when the rule resolves")
        return await self._for_event(ctx, "down")

    async def restore(self, ctx: ActionContext) -> Outcome:
        if self.p.step_up_after is None:
            return Outcome(True, "stepping up is by hand: specguard ladder up")
        return await self._for_event(ctx, "up")

    async def _for_event(self, ctx: ActionContext, way: str) -> Outcome:
        memory = self.memory(ctx)
        key = answer_key(ctx.event_id, way)
        async with self._lock:
            state = await memory.read(STATE_KEY) or empty_state()
            if key in state["done"]:  # carried out before a crash: the same answer, nothing again
                ok, detail = state["done"][key]
                return Outcome(ok, detail)
            change = state["change"]
            if change is not None:
                resumed = await self._resume(memory, change)
                if resumed.retry_after is not None:
                    return resumed  # deferred for want of a fleet slot: this run waits behind it
                if change["event_id"] == ctx.event_id and change.get("way") == way:
                    return resumed  # this very run, cut short by a stop: completed now
            current = await self._current(memory)
            target = self._below(current) if way == "down" else self._above(current)
            if target is None:
                where = "bottom" if way == "down" else "top"
                nothing = Outcome(True, f"k={current} is the ladder's {where} rung: nothing to change")
                return await self._answer(memory, ctx.event_id, way, nothing)
            why = f"{ctx.rule} {'firing' if way == 'down' else f'resolved for {self.restore_delay:g}s'}"
            # The answer is recorded with the step: in the transaction that closes its journal.
            return await self._change(memory, current, target, why, ctx.event_id, way)

    # --- by hand: `specguard ladder` --------------------------------------------------------------

    async def step(self, memory: ActionMemory, to: str | int, who: str) -> Outcome:
        """``to``: "up", "down" or a rung; the change made by hand (over the daemon's API)."""
        async with self._lock:
            state = await memory.read(STATE_KEY) or empty_state()
            if state["change"] is not None:
                resumed = await self._resume(memory, state["change"])
                if resumed.retry_after is not None:
                    return resumed  # the unfinished change waits for a fleet slot; so does this step
            current = await self._current(memory)
            if to == "up":
                target = self._above(current)
            elif to == "down":
                target = self._below(current)
            else:
                target = int(to)
                if target not in self.p.ladder:
                    return Outcome(False, f"k={target} is not a rung of the ladder {list(self.p.ladder)}")
            if target is None or target == current:
                return Outcome(True, f"already at k={current}: nothing to change")
            way = "up" if target > current else "down"
            return await self._change(memory, current, target, f"by hand ({who})", None, way)

    async def show(self, memory: ActionMemory) -> dict[str, Any]:
        state = await memory.read(STATE_KEY) or empty_state()
        try:
            in_file = self._read_config(read_or_none(self.path))
            file_k: int | str | None = int(in_file.get(speculative.K, 0)) if in_file else 0
        except speculative.ConfigError as exc:
            file_k = f"unreadable: {exc}"
        change = state["change"]
        return {
            "action": self.name,
            "ladder": list(self.p.ladder),
            "k": state["k"] if state["k"] is not None else file_k,
            "file": str(self.path),
            "file_k": file_k,
            # not the files' texts the journal keeps for a rollback: vLLM's YAML may hold its api-key
            "change": None if change is None else {k: change[k] for k in SHOWN_CHANGE if k in change},
            "log": state["log"],
        }

    async def holding(self, memory: ActionMemory) -> Holding:
        """k as last verified; before specguard changed anything, what the config file starts vLLM
        with (mid-change: the k being left, until the new one is verified)."""
        state = await memory.read(STATE_KEY)
        if state and state.get("k") is not None:
            return Holding(speculative_tokens=int(state["k"]))
        try:
            text = await asyncio.to_thread(read_or_none, self.path)
            if text is None:  # no file yet: nothing says what vLLM runs
                return Holding()
            config = self._read_config(text)
            return Holding(speculative_tokens=int(config.get(speculative.K, 0)) if config else 0)
        except (OSError, ValueError, TypeError):  # unreadable, or no number: unknown, not 0
            return Holding()

    # --- a daemon that died mid-change ---------------------------------------------------------

    async def tick(self, memory: ActionMemory) -> float | None:
        """An unfinished change in the store (the daemon stopped mid-restart): complete it. (A
        long-running action's tick is carried out aside: it may take minutes.) Deferred for want
        of a fleet slot: tried again after the fleet's ``retry``."""
        state = await memory.read(STATE_KEY)
        if not state or not state.get("change") or self._lock.locked():
            return None
        async with self._lock:
            fresh = await memory.read(STATE_KEY) or empty_state()
            if fresh["change"] is not None:
                outcome = await self._resume(memory, fresh["change"])
                if outcome.retry_after is not None:
                    return time.time() + outcome.retry_after
        return None

    async def _resume(self, memory: ActionMemory, change: dict[str, Any]) -> Outcome:
        """Complete (or roll back) a change a stopped daemon left, under a fresh fleet slot: the
        old lease ended with the process, or is renewed when it has not (the same token)."""
        log.warning(
            "found an unfinished change of k %s -> %s (%s, at %s): completing it",
            change["from"], change["to"], change["reason"], change["phase"],
        )  # fmt: skip
        slot = await self._take_slot(f"k {change['from']} -> {change['to']}: {change['reason']} (resumed)")
        if isinstance(slot, Outcome):
            return slot  # the journal stays open: the tick (or the run) tries again
        if slot is not None:
            change = {**change, "slot": slot.as_json()}
            await memory.update(STATE_KEY, lambda s: {**(s or empty_state()), "change": dict(change)})
        return await self._carry_out(memory, change, resumed=True)

    # --- where on the ladder ----------------------------------------------------------------------

    async def _current(self, memory: ActionMemory) -> int:
        """k as last verified, else as the file says (a first run), remembering its other keys."""
        state = await memory.read(STATE_KEY) or empty_state()
        text = await asyncio.to_thread(read_or_none, self.path)
        config = self._read_config(text)
        version = await self.server.version()

        def learn(s: dict[str, Any] | None) -> dict[str, Any]:
            s = s or empty_state()
            if config is not None:
                s["base"] = {k: v for k, v in config.items() if k != speculative.K}
            if version is not None:
                s["version"] = version
            if s["k"] is None:
                s["k"] = int(config.get(speculative.K, 0)) if config else 0
            return s

        state = await memory.update(STATE_KEY, learn)
        return int(state["k"])

    def _below(self, k: int) -> int | None:
        lower = [r for r in self.p.ladder if r < k]
        return lower[0] if lower else None

    def _above(self, k: int) -> int | None:
        higher = [r for r in self.p.ladder if r > k]
        return higher[-1] if higher else None
