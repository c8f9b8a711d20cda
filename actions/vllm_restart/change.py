"""One change of k, step by step: the config file written, vLLM restarted and awaited (its start
watched), the new k verified, or the config last seen running rolled back to; each phase journaled
in the action's memory before it is taken, and the journal closed with the firing's answer.

The journal's record (``STATE_KEY``): the k last verified and the file text it ran with, the
change under way, the answers given to firings, and the log of changes ``specguard ladder show``
lists.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from specguard.actions.base import ActionMemory, Outcome
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.actions.vllm_restart import speculative
from specguard.actions.vllm_restart.params import VllmRestartParams
from specguard.actions.vllm_restart.process import StatusCommandWatch, UnitWatch, Watch
from specguard.actions.vllm_restart.server import NotReady, Server
from specguard.common.commands import CommandError, run_command
from specguard.common.files import read_or_none, write_atomically
from specguard.common.sequential import Decision
from specguard.coordination.gate import RESTARTS, FleetGate, Refused, Slot

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


def empty_state() -> dict[str, Any]:
    # good: the file's text and k last verified running (what a failed change rolls back to)
    return {"base": None, "k": None, "version": None, "good": None, "change": None, "done": {}, "log": []}


class ChangeSteps:
    """The steps of a change, as ``VllmRestartAction`` takes them (it sets the attributes below)."""

    name: str
    p: VllmRestartParams
    server: Server
    path: Path
    restart_argv: tuple[str, ...]
    _drain: FeatureFlagAction | None
    fleet: FleetGate | None

    @property
    def holder(self) -> str:
        """How a drain is shown among the flag's holders."""
        return f"vllm_restart:{self.name}"

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
        state = await memory.read(STATE_KEY) or empty_state()
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
        slot = await self._take_slot(f"k {current} -> {target}: {reason}")
        if isinstance(slot, Outcome):
            return slot  # deferred: no journal opened, nothing changed; the run tries again
        change = {
            "from": current, "to": target, "reason": reason, "event_id": event_id, "way": way, "phase": "write",
            "before": before, "after": after, "config_before": config_before, "config_after": config_after,
            "rollback_text": good["text"], "rollback_k": good["k"], "started": time.time(), "timings": {},
            "slot": None if slot is None else slot.as_json(),
        }  # fmt: skip
        await memory.update(STATE_KEY, lambda s: {**(s or empty_state()), "change": change})
        return await self._carry_out(memory, change, resumed=False)

    async def _take_slot(self, incident: str) -> Slot | Outcome | None:
        """With a fleet: a slot of its restarts semaphore, or the deferral saying why there is none
        (paged when the store cannot be reached). Without one: None, nothing to take."""
        if self.fleet is None:
            return None
        got = await self.fleet.take(RESTARTS, self.name, incident)
        if isinstance(got, Refused):
            log.warning("%s: restart deferred: %s", self.name, got.why)
            return Outcome(
                False,
                f"deferred: {got.why}; tried again in {self.fleet.retry:g}s",
                self.fleet.retry,
                got.page,
            )
        log.info("%s: took the fleet's %s", self.name, got.shown())
        return got

    async def _carry_out(self, memory: ActionMemory, change: dict[str, Any], resumed: bool) -> Outcome:
        """Take ``change`` from its phase to the end, its fleet slot's lease kept meanwhile."""
        slot = Slot.from_json(change.get("slot"))
        if self.fleet is None or slot is None:
            return await self._steps(memory, change, resumed)
        async with self.fleet.keeping(slot):
            return await self._steps(memory, change, resumed)

    async def _steps(self, memory: ActionMemory, change: dict[str, Any], resumed: bool) -> Outcome:
        """Take ``change`` from its phase to the end, journaling each phase first."""

        async def phase(name: str) -> None:
            change["phase"] = name
            await memory.update(STATE_KEY, lambda s: {**(s or empty_state()), "change": dict(change)})

        timings: dict[str, float] = change["timings"]
        drain = self._drain
        if drain is not None and change["phase"] == "write":  # traffic away before anything changes
            held = await drain.engage_for(memory.of(drain.name), self.holder)
            if not held.ok:
                detail = f"k {change['from']} -> {change['to']} not started: the drain failed: {held.detail}"
                return await self._finish(memory, change, False, detail, None)
        if change["phase"] == "write":  # the fencing token, once more, before anything changes
            lost = await self._slot_lost(change)
            if lost is not None:
                return await self._not_started(memory, change, lost)
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

    async def _slot_lost(self, change: dict[str, Any]) -> str | None:
        """What happened to the change's fleet slot when it is no longer its own; None while it is
        (or without a fleet)."""
        slot = Slot.from_json(change.get("slot"))
        return None if self.fleet is None or slot is None else await self.fleet.check(slot)

    async def _not_started(self, memory: ActionMemory, change: dict[str, Any], lost: str) -> Outcome:
        """Nothing was written: its slot ended before it (the holder paused past its lease, or the
        store cannot confirm it). The journal closes without an answer, the drain lets go, and the
        run is deferred: it asks for a slot again."""
        await memory.update(STATE_KEY, lambda s: {**(s or empty_state()), "change": None})
        if self._drain is not None:
            self._drain.wake()
        assert self.fleet is not None
        detail = f"deferred: k {change['from']} -> {change['to']} not started: {lost}; tried again in {self.fleet.retry:g}s"
        log.warning("%s: %s", self.name, detail)
        return Outcome(False, detail, self.fleet.retry)

    async def _answer(
        self, memory: ActionMemory, event_id: int | None, way: str, outcome: Outcome
    ) -> Outcome:
        """A firing's answer when no step was started (so no journal to close): kept, so that the
        run repeated after a crash gives it again."""
        if event_id is not None:
            await memory.update(STATE_KEY, lambda s: _done(s, answer_key(event_id, way), outcome))
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
        slot = Slot.from_json(change.get("slot"))
        lost = await self._slot_lost(change)
        if lost is not None:  # the fencing token says the slot was no longer ours: done without one
            detail += f"; done without a fleet slot: {lost}"
        ended = time.time()
        outcome = Outcome(ok, detail, page=lost is not None)
        entry = {
            "at": change["started"], "ended": ended, "from": change["from"], "to": change["to"],
            "reason": change["reason"], "ok": ok, "detail": detail,
            "config_before": change["config_before"], "config_after": change["config_after"],
        }  # fmt: skip

        def end(s: dict[str, Any] | None) -> dict[str, Any]:
            s = s or empty_state()
            s["change"] = None
            if k is not None:
                s["k"] = k
                s["good"] = {"text": running, "k": k}
            s["drain_kept"] = keep_drain or (bool(s.get("drain_kept")) and k is None)
            s["log"] = [*s["log"], entry][-KEEP_LOG:]
            if change["event_id"] is not None:
                # (journals written before changes had a way were a firing's, stepping down)
                s = _done(s, answer_key(change["event_id"], change.get("way", "down")), outcome)
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
        (log.info if ok and lost is None else log.error)("%s", detail)
        if self.fleet is not None and slot is not None:
            await self.fleet.give_back(slot)  # after the journal is closed: never a step without one
        if self._drain is not None:
            self._drain.wake()  # the journal is closed: the drain no longer holds the flag
        return outcome


def _shown(config: dict[str, Any] | None) -> str:
    return "off" if config is None else json.dumps(config, separators=(",", ":"))


def answer_key(event_id: int | None, way: str) -> str:
    return f"{event_id}:{way}"


def _done(state: dict[str, Any] | None, key: str, outcome: Outcome) -> dict[str, Any]:
    state = state or empty_state()
    done = dict(state["done"])
    done[key] = [outcome.ok, outcome.detail]
    state["done"] = dict(list(done.items())[-KEEP_DONE:])
    return state


async def _timed(step: Callable[[], Awaitable[Any]]) -> float:
    started = time.monotonic()
    await step()
    return time.monotonic() - started
