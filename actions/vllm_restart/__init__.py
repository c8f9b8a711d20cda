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
verification, or rolls back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Holding, Outcome
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.actions.vllm_restart import speculative
from specguard.actions.vllm_restart.params import EnvFile as EnvFile
from specguard.actions.vllm_restart.params import VllmConfigFile as VllmConfigFile
from specguard.actions.vllm_restart.params import VllmRestartParams as VllmRestartParams
from specguard.actions.vllm_restart.process import StatusCommandWatch, UnitWatch, Watch
from specguard.actions.vllm_restart.server import NotReady, Server
from specguard.common.commands import CommandError, run_command
from specguard.common.files import read_or_none, write_atomically
from specguard.common.locks import named_lock
from specguard.common.secrets import read_if_given
from specguard.common.sequential import Decision

log = logging.getLogger("specguard.action.vllm_restart")

STATE_KEY = "ladder"
KEEP_DONE = 50  # outcomes remembered per firing (a run repeated after a crash answers from here)
KEEP_LOG = 200  # rung changes kept for `specguard ladder show`
SHOWN_CHANGE = (
    "from",
    "to",
    "reason",
    "event_id",
    "way",
    "phase",
    "started",
    "config_before",
    "config_after",
)


def _empty() -> dict[str, Any]:
    # good: the file's text and k last verified running (what a failed change rolls back to)
    return {"base": None, "k": None, "version": None, "good": None, "change": None, "done": {}, "log": []}


class VllmRestartAction(Action):
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

    @property
    def holder(self) -> str:
        """How a drain is shown among the flag's holders."""
        return f"vllm_restart:{self.name}"

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
        key = _answer_key(ctx.event_id, way)
        async with self._lock:
            state = await memory.read(STATE_KEY) or _empty()
            if key in state["done"]:  # carried out before a crash: the same answer, nothing again
                ok, detail = state["done"][key]
                return Outcome(ok, detail)
            change = state["change"]
            if change is not None:
                resumed = await self._resume(memory, change)
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
            state = await memory.read(STATE_KEY) or _empty()
            if state["change"] is not None:
                await self._resume(memory, state["change"])
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
        state = await memory.read(STATE_KEY) or _empty()
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
        long-running action's tick is carried out aside: it may take minutes.)"""
        state = await memory.read(STATE_KEY)
        if not state or not state.get("change") or self._lock.locked():
            return None
        async with self._lock:
            fresh = await memory.read(STATE_KEY) or _empty()
            if fresh["change"] is not None:
                await self._resume(memory, fresh["change"])
        return None

    async def _resume(self, memory: ActionMemory, change: dict[str, Any]) -> Outcome:
        log.warning(
            "found an unfinished change of k %s -> %s (%s, at %s): completing it",
            change["from"], change["to"], change["reason"], change["phase"],
        )  # fmt: skip
        return await self._carry_out(memory, change, resumed=True)

    # --- a change --------------------------------------------------------------------------------

    async def _current(self, memory: ActionMemory) -> int:
        """k as last verified, else as the file says (a first run), remembering its other keys."""
        state = await memory.read(STATE_KEY) or _empty()
        text = await asyncio.to_thread(read_or_none, self.path)
        config = self._read_config(text)
        version = await self.server.version()

        def learn(s: dict[str, Any] | None) -> dict[str, Any]:
            s = s or _empty()
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

    def _read_config(self, text: str | None) -> dict[str, Any] | None:
        if self.p.env_file is not None:
            return speculative.read_env(text, str(self.path))
        return speculative.read_yaml(text, str(self.path))

    def _render(self, text: str | None, config: dict[str, Any] | None, version: str | None, k: int) -> str:
        if self.p.env_file is not None:
            return speculative.render_env(config, f"written by specguard ({self.name}): k={k}")
        return speculative.render_yaml(text, config, version, str(self.path))

    async def _change(
        self, memory: ActionMemory, current: int, target: int, reason: str, event_id: int | None, way: str
    ) -> Outcome:
        state = await memory.read(STATE_KEY) or _empty()
        before = await asyncio.to_thread(read_or_none, self.path)
        try:
            config_before = self._read_config(before)
            base = state["base"]
            if target > 0 and base is None:
                refused = Outcome(
                    False, f"{self.path} has no speculative config, and none is known to turn back on"
                )
                return await self._answer(memory, event_id, way, refused)
            config_after = speculative.with_k(base or {}, target)
            after = self._render(before, config_after, state["version"], target)
        except speculative.ConfigError as exc:
            return await self._answer(memory, event_id, way, Outcome(False, str(exc)))
        # A failure rolls back to the config last seen running (the file may have been edited since
        # it was read at start: a broken draft path must not be what the rollback restores).
        good = state["good"] or {"text": before, "k": current}
        change = {
            "from": current, "to": target, "reason": reason, "event_id": event_id, "way": way, "phase": "write",
            "before": before, "after": after, "config_before": config_before, "config_after": config_after,
            "rollback_text": good["text"], "rollback_k": good["k"], "started": time.time(), "timings": {},
        }  # fmt: skip
        await memory.update(STATE_KEY, lambda s: {**(s or _empty()), "change": change})
        return await self._carry_out(memory, change, resumed=False)

    async def _carry_out(self, memory: ActionMemory, change: dict[str, Any], resumed: bool) -> Outcome:
        """Take ``change`` from its phase to the end, journaling each phase first."""

        async def phase(name: str) -> None:
            change["phase"] = name
            await memory.update(STATE_KEY, lambda s: {**(s or _empty()), "change": dict(change)})

        timings: dict[str, float] = change["timings"]
        drain = self._drain
        if drain is not None and change["phase"] == "write":  # traffic away before anything changes
            held = await drain.engage_for(memory.of(drain.name), self.holder)
            if not held.ok:
                detail = f"k {change['from']} -> {change['to']} not started: the drain failed: {held.detail}"
                return await self._finish(memory, change, False, detail, None)
        try:
            if change["phase"] == "write":
                if self.p.env_file is not None:  # under the state directory: made on first use
                    await asyncio.to_thread(self.path.parent.mkdir, 0o750, True, True)
                await asyncio.to_thread(write_atomically, self.path, change["after"])
                await phase("restart")
            if change["phase"] == "restart":
                timings["restart"] = await _timed(self._restart)
                change["restarted"] = time.time()
                await phase("verify")
            if change["phase"] == "verify":
                watch = self._watch(change.get("restarted", time.time()))
                timings["ready"] = await _timed(lambda: self._wait_healthy(watch))
                checking = time.monotonic()
                seen = await self.server.verify(
                    change["to"], self.p.verify_requests, self.p.verify_max_tokens, self.p.model
                )
                recovered = True
                if change["to"] > 0 and self.p.verify_acceptance is not None:
                    verdict = await self.server.probe_acceptance(
                        self.p.verify_acceptance, self.p.verify_requests, self.p.verify_max_tokens,
                        self.p.verify_temperature, self.p.model,
                    )  # fmt: skip
                    seen += f"; {verdict.detail}"
                    # Still collapsed: vLLM runs the new config as it should (no rollback: the old
                    # k was no better), but the remedy did not work, and the outcome says so.
                    recovered = verdict.decision is not Decision.COLLAPSED
                timings["verify"] = time.monotonic() - checking
                detail = (
                    f"k {change['from']} -> {change['to']}: restarted in {timings.get('restart', 0):.1f}s, healthy "
                    f"after {timings['ready']:.0f}s, verified in {timings['verify']:.1f}s: {seen}"
                    + (" (completed after specguard restarted)" if resumed else "")
                )  # fmt: skip
                detail += await self._undrain(memory)
                return await self._finish(memory, change, recovered, detail, change["to"], change["after"])
        except (OSError, CommandError, NotReady) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            change["why"] = f"k {change['from']} -> {change['to']} failed at {change['phase']}: {why}"
            log.error("%s; rolling back to k=%s", change["why"], change["rollback_k"])
            await phase("rollback")
        # Rolling back: the config last seen running, a restart, its k verified.
        try:
            text = change["rollback_text"]
            if text is None:
                await asyncio.to_thread(self.path.unlink, True)
            else:
                await asyncio.to_thread(write_atomically, self.path, text)
            await self._restart()
            await self._wait_healthy(self._watch(time.time()))
            seen = await self.server.verify(
                change["rollback_k"], self.p.verify_requests, self.p.verify_max_tokens, self.p.model
            )
        except (OSError, CommandError, NotReady) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            detail = (
                f"{change.get('why', 'the change failed')}; rolling back failed too: {why}: vLLM needs a hand"
            )
            if self._drain is not None:
                detail += "; the drain stays engaged"
            return await self._finish(memory, change, False, detail, None, keep_drain=True)
        detail = f"{change.get('why', 'the change failed')}; rolled back to k={change['rollback_k']}: {seen}"
        detail += await self._undrain(memory)
        return await self._finish(
            memory, change, False, detail, change["rollback_k"], change["rollback_text"]
        )

    async def _answer(
        self, memory: ActionMemory, event_id: int | None, way: str, outcome: Outcome
    ) -> Outcome:
        """A firing's answer when no step was started (so no journal to close): kept, so that the
        run repeated after a crash gives it again."""
        if event_id is not None:
            await memory.update(STATE_KEY, lambda s: _done(s, _answer_key(event_id, way), outcome))
        return outcome

    async def _undrain(self, memory: ActionMemory) -> str:
        """The drain lets go once vLLM is verified: the journal closes, and the flag's controller,
        woken, restores the flag unless a rule holds it (no canary: the verification was one)."""
        if self._drain is None:
            return ""
        self._drain.wake()
        return f"; drain {self._drain.name}: let go (restored unless a rule still holds it)"

    async def _restart(self) -> None:
        await run_command(self.restart_argv, self.p.command_timeout, "restart")

    def _watch(self, restarted: float) -> Watch | None:
        """What says, while /health is awaited, that the server restarted at ``restarted`` (unix
        time) is down; None when nothing can."""
        if self.p.unit is not None:
            look: Watch = UnitWatch(self.p.unit)
        elif self.p.status_command is not None:
            look = StatusCommandWatch(self.p.status_command)
        else:
            return None

        async def watch() -> str | None:
            down = await look()
            return None if down is None else f"{down} {time.time() - restarted:.0f}s after the restart"

        return watch

    async def _wait_healthy(self, watch: Watch | None) -> float:
        return await self.server.wait_healthy(self.p.health_timeout, watch=watch)

    async def _finish(
        self,
        memory: ActionMemory,
        change: dict[str, Any],
        ok: bool,
        detail: str,
        k: int | None,
        running: str | None = None,
        keep_drain: bool = False,
    ) -> Outcome:
        """Close the journal: ``k`` and the file text ``running`` are what vLLM now runs (verified);
        None when nothing is known to run (``keep_drain``: the drain holds on, vLLM needs a hand). A firing's step records its answer in the same
        transaction: a daemon killed just after it finds the step done and answered, never a
        closed journal without an answer, which the firing's repeated run would take as a step
        still to make."""
        ended = time.time()
        outcome = Outcome(ok, detail)
        entry = {
            "at": change["started"], "ended": ended, "from": change["from"], "to": change["to"],
            "reason": change["reason"], "ok": ok, "detail": detail,
            "config_before": change["config_before"], "config_after": change["config_after"],
        }  # fmt: skip

        def end(s: dict[str, Any] | None) -> dict[str, Any]:
            s = s or _empty()
            s["change"] = None
            if k is not None:
                s["k"] = k
                s["good"] = {"text": running, "k": k}
            s["drain_kept"] = keep_drain or (bool(s.get("drain_kept")) and k is None)
            s["log"] = [*s["log"], entry][-KEEP_LOG:]
            if change["event_id"] is not None:
                # (journals written before changes had a way were a firing's, stepping down)
                s = _done(s, _answer_key(change["event_id"], change.get("way", "down")), outcome)
            return s

        def notes() -> list[tuple[int, str]]:
            if change["event_id"] is None:
                return []
            shown = (
                f"k {change['from']} -> {change['to']} ({'ok' if ok else 'failed'}, {ended - change['started']:.0f}s): "
                f"speculative config {_shown(change['config_before'])} -> {_shown(change['config_after'])}; {detail}"
            )
            return [(int(change["event_id"]), shown)]

        await memory.update(STATE_KEY, end, notes)
        (log.info if ok else log.error)("%s", detail)
        if self._drain is not None:
            self._drain.wake()  # the journal is closed: the drain no longer holds the flag
        return outcome


def _shown(config: dict[str, Any] | None) -> str:
    return "off" if config is None else json.dumps(config, separators=(",", ":"))


def _answer_key(event_id: int | None, way: str) -> str:
    return f"{event_id}:{way}"


def _done(state: dict[str, Any] | None, key: str, outcome: Outcome) -> dict[str, Any]:
    state = state or _empty()
    done = dict(state["done"])
    done[key] = [outcome.ok, outcome.detail]
    state["done"] = dict(list(done.items())[-KEEP_DONE:])
    return state


async def _timed(step: Callable[[], Awaitable[Any]]) -> float:
    started = time.monotonic()
    await step()
    return time.monotonic() - started
