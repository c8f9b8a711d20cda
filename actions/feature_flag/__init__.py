"""The ``feature_flag`` action: fall back to standard decoding by setting a flag that a router or
the serving stack reads, and set it back once the rule has stayed resolved.

- ``run`` (a rule fires) engages the flag. The flag's state is kept in specguard's store: engaging
  an engaged flag changes nothing, and every rule series that fired is recorded as a holder.
- ``restore`` (the dispatcher calls it once the rule has stayed resolved for ``quiet_period``)
  lets go of the series' hold. The flag is set back only when the last holder lets go, and, with
  ``canary``, only when a probe of the speculative server shows acceptance back above its
  threshold. A failed canary or a failed write keeps the fallback; the dispatcher tries again
  after a doubling wait (``restore_backoff`` up to ``restore_max_backoff``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from pydantic import Field, model_validator

from actions.base import Action, ActionContext, ActionMemory, ActionParams, Holding, Outcome
from actions.feature_flag.backends import (
    Backend,
    BackendError,
    FileBackend,
    FileParams,
    HttpBackend,
    HttpParams,
)
from actions.feature_flag.canary import Canary, CanaryParams
from common.secrets import read_if_given
from rules.durations import Duration, format_duration

STATE_KEY = "flag"
KEEP_SPANS = 500  # engagements remembered (with their restore) for the weekly report


class FeatureFlagParams(ActionParams):
    type: Literal["feature_flag"] = "feature_flag"
    timeout: Duration = Field(180.0, gt=0)  # a run or restore: retries and the canary included
    http: HttpParams | None = None
    file: FileParams | None = None
    quiet_period: Duration = Field(300.0, ge=0)  # resolved this long before the flag is restored
    canary: CanaryParams | None = None
    restore_backoff: Duration = Field(300.0, gt=0)  # after a failed restore or canary; doubled
    restore_max_backoff: Duration = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _one_backend(self) -> FeatureFlagParams:
        if (self.http is None) == (self.file is None):
            raise ValueError("give one backend: `http` (a flag API) or `file` (a flag file)")
        return self


def _empty() -> dict[str, Any]:
    return {"engaged": False, "since": None, "holders": {}, "failures": 0}


def holder_of(ctx: ActionContext) -> str:
    """``rule{label="value",...}``: one rule series holding the flag."""
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(ctx.labels.items()))
    return f"{ctx.rule}{{{labels}}}"


class FeatureFlagAction(Action):
    type = "feature_flag"
    Params = FeatureFlagParams
    changes_world = True

    def __init__(self, name: str, params: ActionParams) -> None:
        super().__init__(name, params)
        assert isinstance(params, FeatureFlagParams)
        self.flag = params
        backend: Backend
        if params.http is not None:
            token = read_if_given(params.http.token, f"actions.{name}.http.token")
            backend = HttpBackend(params.http, token)
            self._values = (params.http.engage, params.http.restore)
        else:
            assert params.file is not None
            backend = FileBackend(params.file)
            self._values = (params.file.engage, params.file.restore)
        self.backend = backend
        self.canary: Canary | None = None
        if params.canary is not None:
            token = read_if_given(params.canary.token, f"actions.{name}.canary.token")
            self.canary = Canary(params.canary, token)
        # One change of this flag at a time: an engage must not slip in between a restore's
        # "no holder left" and its write.
        self._lock = asyncio.Lock()

    @property
    def restore_delay(self) -> float:
        return self.flag.quiet_period

    def _backoff(self, failures: int) -> float:
        return float(
            min(self.flag.restore_max_backoff, self.flag.restore_backoff * 2 ** max(0, failures - 1))
        )

    async def run(self, ctx: ActionContext) -> Outcome:
        return await self.hold(self.memory(ctx), holder_of(ctx))

    async def holding(self, memory: ActionMemory) -> Holding:
        record = await memory.read(STATE_KEY)
        return Holding(fallback_engaged=bool(record and record.get("engaged")))

    async def restore(self, ctx: ActionContext) -> Outcome:
        return await self.release(self.memory(ctx), holder_of(ctx))

    async def hold(self, memory: ActionMemory, holder: str) -> Outcome:
        """``holder`` holds the flag; engaged if it was not (another action's drain uses this)."""
        async with self._lock:
            now = time.time()

            def hold(record: dict[str, Any] | None) -> dict[str, Any]:
                record = record or _empty()
                record["holders"].setdefault(holder, now)
                return record

            record = await memory.update(STATE_KEY, hold)
            held = len(record["holders"])
            if record["engaged"]:
                since = format_duration(round(max(0.0, now - record["since"]))) if record["since"] else "?"
                return Outcome(True, f"already engaged (for {since}); held by {held} rule series")
            try:
                done = await self.backend.set(self._values[0], "engage")
            except BackendError as exc:
                return Outcome(False, str(exc))

            def engaged(record: dict[str, Any] | None) -> dict[str, Any]:
                record = record or _empty()
                record.update(engaged=True, since=now, failures=0)
                record["spans"] = [*record.get("spans", []), {"engaged": now, "restored": None}][-KEEP_SPANS:]
                return record

            await memory.update(STATE_KEY, engaged)
            return Outcome(True, f"fallback engaged: {done}")

    async def release(self, memory: ActionMemory, holder: str, canary: bool = True) -> Outcome:
        """``holder`` lets go; the flag is restored when no holder is left (after the canary, if
        there is one and ``canary``)."""
        async with self._lock:

            def release(record: dict[str, Any] | None) -> dict[str, Any]:
                record = record or _empty()
                record["holders"].pop(holder, None)
                return record

            record = await memory.update(STATE_KEY, release)
            others = sorted(record["holders"])
            if others:
                shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
                return Outcome(True, f"let go; still held by {shown}: the fallback stays engaged")
            if not record["engaged"]:
                return Outcome(True, "not engaged: nothing to restore")
            checked = ""
            if self.canary is not None and canary:
                result = await self.canary.probe()
                if not result.ok:
                    return await self._failed(memory, result.detail)
                checked = f" ({result.detail})"
            try:
                done = await self.backend.set(self._values[1], "restore")
            except BackendError as exc:
                return await self._failed(memory, str(exc))
            since = record["since"]

            def restored(record: dict[str, Any] | None) -> dict[str, Any]:
                record = record or _empty()
                record.update(engaged=False, since=None, failures=0)
                spans = record.get("spans") or []
                if spans and spans[-1].get("restored") is None:
                    spans[-1]["restored"] = time.time()
                return record

            await memory.update(STATE_KEY, restored)
            lasted = f" after {format_duration(round(time.time() - since))} engaged" if since else ""
            return Outcome(True, f"speculative decoding restored{lasted}: {done}{checked}")

    async def _failed(self, memory: Any, why: str) -> Outcome:
        def failed(record: dict[str, Any] | None) -> dict[str, Any]:
            record = record or _empty()
            record["failures"] = int(record.get("failures", 0)) + 1
            return record

        record = await memory.update(STATE_KEY, failed)
        wait = self._backoff(record["failures"])
        return Outcome(
            False,
            f"{why}; the fallback stays engaged, next try in {format_duration(round(wait))}",
            retry_after=wait,
        )
