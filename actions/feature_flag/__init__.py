"""The ``feature_flag`` action: fall back to standard decoding by setting a flag that a router or
the serving stack reads, and set it back once the rules that wanted it have stayed quiet.

What the flag should be is not decided here. The fallback controller
(``dispatch.fallback``) derives it from the rules' states on every tick: engaged while an
eligible, unsilenced series fires (its rule configured, enabled, naming this action), while the
flag is engaged and any eligible series fires, and for ``quiet_period`` after the last one stops;
then restored, once the canary (if there is one) sees acceptance back. It calls ``engage`` and
``restore`` here, which change the world and keep what they confirmed in the store:

- ``state``: ``engaged`` or ``restored`` as last confirmed (a write acknowledged, a file read back,
  the flag read back from the world), or ``unknown`` while a write is under way or after one whose
  outcome is not known (a timeout, a 5xx, a crash between the write and its record): the
  controller then writes again, which is harmless, rather than assume;
- ``since`` and ``spans``: when it was engaged, for the weekly report.

A failed write is tried again after ``retry_backoff`` (doubled, up to ``retry_max_backoff``); a
canary that sees acceptance still low after ``restore_backoff`` (doubled, up to
``restore_max_backoff``). A ladder (``vllm_restart`` with ``drain``) engages the flag itself
before it restarts vLLM (``engage`` with the lock held), and holds it while its change is under
way; the controller lets go once the ladder's journal is closed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Holding, Outcome
from specguard.actions.feature_flag.answers import FollowRedirects
from specguard.actions.feature_flag.backends import (
    Backend,
    BackendError,
    FileBackend,
    FileParams,
    HttpBackend,
    HttpParams,
)
from specguard.actions.feature_flag.canary import Canary, CanaryParams
from specguard.actions.feature_flag.nginx import NginxBackend, NginxParams
from specguard.actions.sizes import ResponseSize
from specguard.common.http import MAX_RESPONSE_SIZE
from specguard.common.locks import named_lock
from specguard.common.secrets import read_if_given
from specguard.coordination.gate import FALLBACK, FleetGate, Refused
from specguard.rules.durations import Duration, format_duration, format_wait

STATE_KEY = "flag"
KEEP_SPANS = 500  # engagements remembered (with their restore) for the weekly report
ENGAGED, RESTORED, UNKNOWN = "engaged", "restored", "unknown"


class FeatureFlagParams(ActionParams):
    type: Literal["feature_flag"] = "feature_flag"
    timeout: Duration = Field(180.0, gt=0)  # one engage or restore: its retries and the canary included
    http: HttpParams | None = None
    file: FileParams | None = None
    nginx: NginxParams | None = None  # specguard's own router (`specguard routing render`)
    quiet_period: Duration = Field(300.0, ge=0)  # nothing fired this long before the flag is restored
    canary: CanaryParams | None = None
    restore_backoff: Duration = Field(300.0, gt=0)  # after a canary that saw acceptance still low; doubled
    restore_max_backoff: Duration = Field(3600.0, gt=0)
    retry_backoff: Duration = Field(10.0, gt=0)  # after a write that failed (either way); doubled
    retry_max_backoff: Duration = Field(300.0, gt=0)
    # What the flag API and the canary's server may answer: bodies up to this size (over it, the
    # attempt fails), and redirects followed only to the same scheme, host and port when asked to.
    max_response_size: ResponseSize = MAX_RESPONSE_SIZE
    follow_redirects: FollowRedirects = "never"

    @model_validator(mode="after")
    def _one_backend(self) -> FeatureFlagParams:
        given = [name for name in ("http", "file", "nginx") if getattr(self, name) is not None]
        if len(given) != 1:
            said = f"not {' and '.join(f'`{name}`' for name in given)}" if given else "none is given"
            raise ValueError(
                "give exactly one backend: `http` (a flag API), `file` (a flag file) or `nginx` "
                f"(specguard's router); {said}"
            )
        longest = self.longest_restore()
        if self.timeout < longest:
            raise ValueError(
                f"timeout {format_duration(self.timeout)} cannot hold a restore, which may take "
                f"{format_duration(longest)}: {self._parts()}; give timeout {format_duration(longest)} "
                "or more, or shorten those"
            )
        return self

    def longest_write(self) -> float:
        backend = self.http or self.file or self.nginx
        assert backend is not None
        return backend.longest_write()

    def longest_restore(self) -> float:
        """The most one restore may take: the canary's whole probe, then the write with its retries."""
        return (self.canary.timeout if self.canary is not None else 0.0) + self.longest_write()

    def _parts(self) -> str:
        parts = []
        if self.canary is not None:
            parts.append(f"the canary's timeout {format_duration(self.canary.timeout)}")
        if self.http is not None:
            h = self.http
            parts.append(
                f"the flag API's {h.retries + 1} tries of up to {format_duration(h.request_timeout)} "
                f"(http.retries, http.request_timeout) and the waits between them"
            )
        elif self.nginx is not None:
            n = self.nginx
            parts.append(
                f"the router's flag file and {n.retries + 1} tries of up to {format_duration(n.request_timeout)} "
                f"(nginx.retries, nginx.request_timeout) and the waits between them"
            )
        elif self.file is not None and self.file.reload is not None:
            parts.append(f"the reload command's timeout {format_duration(self.file.reload_timeout)}")
        return " plus ".join(parts) or "the write"


class Drain(Protocol):
    """An action that engages the flag while its own change is under way (a ladder's restart)."""

    name: str

    async def draining(self, memory: ActionMemory) -> str | None:
        """Why it holds the flag now (its change under way), or None."""
        ...


def empty() -> dict[str, Any]:
    return {
        "state": RESTORED,
        "engaged": False,
        "since": None,
        "holders": {},
        "failures": 0,
        "canary_failures": 0,
        "hold_end": None,
        "rule_held": False,
        "spans": [],
        "held_by": [],
        "next_try": None,
    }


def record_of(value: Any) -> dict[str, Any]:
    """The flag's record, a record written by an older specguard (``engaged`` only) read as one."""
    record = {**empty(), **(value or {})}
    if not value or "state" not in value:
        record["state"] = ENGAGED if record.get("engaged") else RESTORED
    return record


def confirmed(record: dict[str, Any], state: str, now: float) -> dict[str, Any]:
    """``record`` once the flag is known to be ``state`` (engaged, restored or unknown)."""
    was = record["state"]
    record["state"] = state
    record["engaged"] = state == ENGAGED
    if state == ENGAGED and was != ENGAGED:
        spans = record.get("spans") or []
        if not spans or spans[-1].get("restored") is not None:  # an unknown in between is the same span
            record["spans"] = [*spans, {"engaged": now, "restored": None}][-KEEP_SPANS:]
            record["since"] = now
        record["since"] = record.get("since") or now
    if state == RESTORED and was != RESTORED:
        spans = record.get("spans") or []
        if spans and spans[-1].get("restored") is None:
            spans[-1]["restored"] = now
        record.update(since=None, hold_end=None, rule_held=False, canary_failures=0)
    if state != UNKNOWN:
        record["next_try"] = None
    return record


def holder_of(ctx: ActionContext) -> str:
    """``rule{label="value",...}``: one rule series holding the flag."""
    return holder_name(ctx.rule, ctx.labels)


def holder_name(rule: str, labels: Any) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(dict(labels).items()))
    return f"{rule}{{{shown}}}"


class FeatureFlagAction(Action):
    type = "feature_flag"
    Params = FeatureFlagParams
    changes_world = True
    reconciled = True

    def __init__(self, name: str, params: ActionParams) -> None:
        super().__init__(name, params)
        assert isinstance(params, FeatureFlagParams)
        self.flag = params
        backend: Backend
        if params.http is not None:
            token = read_if_given(params.http.token, f"actions.{name}.http.token")
            backend = HttpBackend(
                params.http,
                token,
                params.max_response_size,
                params.follow_redirects,
                params.retry_max_backoff,
            )
            self._values = (params.http.engage, params.http.restore)
            self.read_every = params.http.read_every
        elif params.nginx is not None:
            backend = NginxBackend(params.nginx, params.max_response_size)
            self._values = ({"fallback": True}, {"fallback": False})
            self.read_every = 0.0  # the router's admin location is on loopback: read on every tick
        else:
            assert params.file is not None
            backend = FileBackend(params.file)
            self._values = (params.file.engage, params.file.restore)
            self.read_every = 0.0  # a file is read back on every tick: it costs nothing
        self.backend: Backend = backend  # any backend: a backtest gives it one held in memory
        self.canary: Canary | None = None
        if params.canary is not None:
            token = read_if_given(params.canary.token, f"actions.{name}.canary.token")
            self.canary = Canary(params.canary, token, params.max_response_size, params.follow_redirects)
        self.drains: list[Drain] = []  # ladders that engage this flag while they restart vLLM
        self.clock: Callable[[], float] = lambda: time.time()  # the dispatcher gives its own
        # Called when the flag should be looked at now (a ladder's change ended): the dispatcher's.
        self.wake: Callable[[], None] = lambda: None
        self.fleet: FleetGate | None = None  # with max_in_fallback: engaging takes a fallback slot

    def coordinate(self, fleet: FleetGate, memory: ActionMemory) -> None:
        if fleet.config.max_in_fallback is None:
            return
        self.fleet = fleet

        async def wanted() -> list[tuple[str, str, str]]:
            # Engaged (or unknown: it may be): the slot is held, taken again after a restart of
            # the daemon or a lease lost while the store was down.
            record = record_of(await memory.read(STATE_KEY))
            return [] if record["state"] == RESTORED else [(FALLBACK, self.name, "the fallback engaged")]

        fleet.keepers[self.name] = wanted

    @property
    def lock(self) -> asyncio.Lock:
        """One change of this flag at a time, across reloads: the controller's, a ladder's drain."""
        return named_lock(f"feature_flag:{self.name}")

    @property
    def restore_delay(self) -> float:
        return self.flag.quiet_period

    def _backoff(self, failures: int, first: float, most: float) -> float:
        return float(min(most, first * 2 ** max(0, failures - 1)))

    async def holding(self, memory: ActionMemory) -> Holding:
        record = record_of(await memory.read(STATE_KEY))
        # unknown (a write under way, or one whose outcome is not known) counts as engaged: it may be
        return Holding(fallback_engaged=record["state"] != RESTORED)

    async def read_world(self) -> str | None:
        """``engaged`` or ``restored`` as the flag reads now, ``unknown`` (the nginx router and its
        flag file disagree), or None (cannot be read, or neither)."""
        try:
            return await self.backend.read(*self._values)
        except (BackendError, OSError):
            return None

    # --- what the controller calls, with ``lock`` held --------------------------------------------

    async def engage(self, memory: ActionMemory) -> Outcome:
        """Write the flag's engage value and confirm it. Idempotent: writing it again changes
        nothing a router sees. A failure leaves the state unknown and says when to try again.
        With a fleet's ``max_in_fallback``: a slot of its fallback semaphore first; none free (or
        the store down), the flag is left as it is and on-call is paged instead, with why."""
        if self.fleet is not None:
            got = await self.fleet.take(FALLBACK, self.name, "the fallback engaged")
            if isinstance(got, Refused):
                return Outcome(
                    False,
                    f"not falling back: {got.why}; on-call is paged instead, next try in {format_wait(self.fleet.retry)}",
                    retry_after=self.fleet.retry,
                    page=True,
                )
        done = await self._write(memory, ENGAGED, "the fallback is not known to be engaged")
        return done if isinstance(done, Outcome) else Outcome(True, f"fallback engaged: {done}")

    async def _write(self, memory: ActionMemory, state: str, unsure: str) -> str | Outcome:
        """Write the value for ``state`` (engaged | restored), journaled: ``unknown`` while under
        way, confirmed once acknowledged. What was done, or the failure's outcome (``unsure``:
        what a failure leaves in doubt)."""

        def starting(value: Any) -> dict[str, Any]:
            record = record_of(value)
            if record["state"] != state:
                record["state"], record["engaged"] = UNKNOWN, False  # a write under way: not known
            return record

        await memory.update(STATE_KEY, starting)
        try:
            engage = state == ENGAGED
            done = await self.backend.set(self._values[0 if engage else 1], "engage" if engage else "restore")
        except BackendError as exc:
            return await self.failed(memory, f"{exc}; {unsure}", exc.retry_after)
        now = self.clock()
        await memory.update(STATE_KEY, lambda v: {**confirmed(record_of(v), state, now), "failures": 0})
        return done

    async def restore_flag(self, memory: ActionMemory, canary: bool = True) -> Outcome:
        """Probe the speculative server (``canary``, when configured), then write the flag's restore
        value and confirm it. A canary that sees acceptance still low keeps the fallback."""
        record = record_of(await memory.read(STATE_KEY))
        since = record["since"]
        checked = ""
        if self.canary is not None and canary:
            result = await self.canary.probe()
            if not result.ok:

                def low(value: Any) -> dict[str, Any]:
                    record = record_of(value)
                    record["canary_failures"] = int(record.get("canary_failures", 0)) + 1
                    return record

                record = await memory.update(STATE_KEY, low)
                wait = self._backoff(
                    record["canary_failures"], self.flag.restore_backoff, self.flag.restore_max_backoff
                )
                return Outcome(
                    False,
                    f"{result.detail}; the fallback stays engaged, next try in {format_wait(wait)}",
                    retry_after=wait,
                )
            checked = f" ({result.detail})"

        done = await self._write(memory, RESTORED, "the fallback may still be engaged")
        if isinstance(done, Outcome):
            return done
        now = self.clock()
        lasted = f" after {format_duration(round(max(0.0, now - since)))} engaged" if since else ""
        if self.fleet is not None:  # restored: the fallback slot goes back (or ends with its lease)
            await self.fleet.give_back_held(FALLBACK, self.name)
        return Outcome(True, f"speculative decoding restored{lasted}: {done}{checked}")

    async def failed(self, memory: ActionMemory, why: str, asked: float | None = None) -> Outcome:
        """A write that failed (or a change cut short): the state unknown, the next try after the
        write backoff, or after what the flag API ``asked`` for (its Retry-After) when that is
        longer, at most ``retry_max_backoff``."""

        def failed(value: Any) -> dict[str, Any]:
            record = record_of(value)
            record["failures"] = int(record.get("failures", 0)) + 1
            record["state"], record["engaged"] = UNKNOWN, False
            return record

        record = await memory.update(STATE_KEY, failed)
        most = self.flag.retry_max_backoff
        wait = self._backoff(record["failures"], self.flag.retry_backoff, most)
        if asked is not None and math.isfinite(asked) and asked > wait:
            wait = min(most, asked)
        return Outcome(False, f"{why}; next try in {format_wait(wait)}", retry_after=wait)

    async def later(self, memory: ActionMemory, at: float | None) -> None:
        """When a change recorded on no event (a drain's) may be tried again (None: now)."""
        await memory.update(STATE_KEY, lambda v: {**record_of(v), "next_try": at})

    async def engage_for(self, memory: ActionMemory, who: str) -> Outcome:
        """Engage the flag now for ``who`` (a ladder about to restart vLLM): already engaged and
        confirmed, nothing is written. Holds the lock."""
        async with self.lock:
            record = record_of(await memory.read(STATE_KEY))
            if record["state"] == ENGAGED:
                return Outcome(True, f"already engaged; held by {who} until its change is over")
            return await self.engage(memory)

    # --- the Action interface: a run engages, a restore restores (outside the controller) ---------

    async def run(self, ctx: ActionContext) -> Outcome:
        async with self.lock:
            return await self.engage(self.memory(ctx))

    async def restore(self, ctx: ActionContext) -> Outcome:
        async with self.lock:
            return await self.restore_flag(self.memory(ctx))
