"""What a host does with the fleet's semaphore: take a slot before a disruption, keep its lease
while the disruption lasts, check its fencing token where the step is recorded, give it back.

Fail safe: the store unreachable is a refusal (``Refused.unavailable``), never a grant; giving back
or renewing that fails is logged, and the lease ends by itself within its TTL.

Level-triggered, like the rest of specguard's world-changing actions: the heartbeat (every third of
the lease) registers this host in the fleet and asks each *keeper* what it should hold now (a flag
engaged holds a ``fallback`` slot), and takes or keeps exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from specguard.coordination.base import FALLBACK, RESTARTS, Budget, Coordinator, Unavailable, limit_of
from specguard.coordination.config import CoordinationConfig

log = logging.getLogger("specguard.fleet")


@dataclass(frozen=True)
class Slot:
    """A slot held: of which semaphore, by which owner (host:action), under which token."""

    semaphore: str
    owner: str
    token: int
    since: float

    def shown(self) -> str:
        return f"{self.semaphore} slot (token {self.token})"

    def as_json(self) -> dict[str, object]:
        return {"semaphore": self.semaphore, "owner": self.owner, "token": self.token, "since": self.since}

    @classmethod
    def from_json(cls, value: object) -> Slot | None:
        if not isinstance(value, dict):
            return None
        try:
            return cls(
                str(value["semaphore"]), str(value["owner"]), int(value["token"]), float(value["since"])
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Refused:
    """No slot: why; whether because the store could not be asked; and whether on-call should be
    paged for it now (the first refusal of an action in an outage of the store: once, not at every
    retry)."""

    why: str
    unavailable: bool = False
    page: bool = False


# A keeper: what slots its action should hold now, as (semaphore, action, incident); called on
# every heartbeat.
Keeper = Callable[[], Awaitable[list[tuple[str, str, str]]]]


class FleetGate:
    def __init__(
        self, coordinator: Coordinator, config: CoordinationConfig, clock: Callable[[], float] = time.time
    ) -> None:
        self.coordinator = coordinator
        self.config = config
        self.clock = clock
        self.host = config.host
        self.keepers: dict[str, Keeper] = {}  # by action name; replaced when the config is reloaded
        self.unavailable_since: float | None = None  # the store could not be asked since then
        self.last_error = ""
        self._paged: set[str] = set()  # the actions on-call has heard of in this outage

    def owner(self, action: str) -> str:
        return f"{self.host}:{action}"

    @property
    def retry(self) -> float:
        return self.config.retry

    async def limit(self, semaphore: str) -> int:
        """The semaphore's limit now: a number, or a share of the hosts registered."""
        spec = self.config.max_concurrent_restarts if semaphore == RESTARTS else self.config.max_in_fallback
        if spec is None:
            raise ValueError(f"no limit is configured for the {semaphore} semaphore")
        if isinstance(spec, int):
            return spec
        hosts = await self.coordinator.hosts()
        return limit_of(spec, max(1, len(hosts)))

    def budget(self, semaphore: str) -> Budget | None:
        if semaphore == RESTARTS and self.config.restarts_per_hour is not None:
            return Budget(self.config.restarts_per_hour, 3600.0)
        return None

    def _down(self, exc: Exception, action: str | None = None) -> Refused:
        now = self.clock()
        if self.unavailable_since is None:
            self.unavailable_since = now
            log.error("the fleet's %s (%s) cannot be reached: %s", self.config.store, self.config.url, exc)
        self.last_error = str(exc)
        page = action is not None and action not in self._paged
        if action is not None:
            self._paged.add(action)
        return Refused(
            f"the fleet's {self.config.store} ({self.config.url}) cannot be reached ({exc}): "
            "no new disruption while it is down",
            unavailable=True,
            page=page,
        )

    def _up(self) -> None:
        if self.unavailable_since is not None:
            log.warning("the fleet's %s answers again", self.config.store)
        self.unavailable_since = None
        self._paged.clear()

    async def take(self, semaphore: str, action: str, incident: str) -> Slot | Refused:
        """A slot for ``action`` of this host, or why not. Held already: the same slot, renewed."""
        try:
            limit = await self.limit(semaphore)
            grant = await self.coordinator.acquire(
                semaphore, self.owner(action), limit, self.config.lease_ttl, incident, self.budget(semaphore)
            )
        except Unavailable as exc:
            return self._down(exc, action)
        self._up()
        if grant.token is None:
            return Refused(grant.why or f"no {semaphore} slot free ({limit} allowed)")
        return Slot(semaphore, self.owner(action), grant.token, self.clock())

    async def renew(self, slot: Slot) -> bool | None:
        """True: the lease runs on; False: it had ended (the slot is no longer ours); None: unknown."""
        try:
            kept = await self.coordinator.renew(slot.semaphore, slot.owner, slot.token, self.config.lease_ttl)
        except Unavailable as exc:
            self._down(exc)
            return None
        self._up()
        return kept

    async def check(self, slot: Slot) -> str | None:
        """The fencing check where a step is recorded: None while ``slot`` is still ours; else what
        happened to it."""
        try:
            held = await self.coordinator.holds(slot.semaphore, slot.owner, slot.token)
        except Unavailable as exc:
            self._down(exc)
            return f"the fleet's {self.config.store} could not confirm its {slot.shown()}: {exc}"
        self._up()
        return None if held else f"its {slot.shown()} had ended: its lease ran out during the step"

    async def give_back(self, slot: Slot) -> None:
        try:
            if not await self.coordinator.release(slot.semaphore, slot.owner, slot.token):
                log.info("%s: the %s had already ended", slot.owner, slot.shown())
        except Unavailable as exc:
            self._down(exc)
            log.warning("%s: the %s could not be given back (%s): it ends with its lease", slot.owner,
                        slot.shown(), exc)  # fmt: skip

    async def give_back_held(self, semaphore: str, action: str) -> None:
        """Give back the slot ``action`` of this host holds now, under whichever token: the one its
        change took, or a newer one the heartbeat took again after a lease was lost. (The store
        says which; nothing of it is kept on this side.)"""
        owner = self.owner(action)
        try:
            held = [h for h in await self.coordinator.holders(semaphore) if h.owner == owner]
        except Unavailable as exc:
            self._down(exc)
            log.warning("%s: its %s slot could not be given back (%s): it ends with its lease", owner,
                        semaphore, exc)  # fmt: skip
            return
        for h in held:
            await self.give_back(Slot(semaphore, owner, h.token, h.since))

    @contextlib.asynccontextmanager
    async def keeping(self, slot: Slot) -> AsyncIterator[None]:
        """Renew ``slot``'s lease every third of its TTL while the body runs (a restart)."""

        async def renew_on() -> None:
            while True:
                await asyncio.sleep(self.config.lease_ttl / 3)
                kept = await self.renew(slot)
                if kept is False:
                    log.error("%s: the %s ended while the step went on", slot.owner, slot.shown())
                    return

        task = asyncio.get_running_loop().create_task(renew_on())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def beat(self) -> None:
        """Once: this host registered, and every keeper's slots taken or kept."""
        try:
            await self.coordinator.register(self.host, self.config.lease_ttl)
        except Unavailable as exc:
            self._down(exc)
            return
        self._up()
        for name, keeper in list(self.keepers.items()):
            try:
                wanted = await keeper()
            except Exception:
                log.exception("what %s should hold in the fleet could not be read", name)
                continue
            for semaphore, action, incident in wanted:
                got = await self.take(semaphore, action, incident)
                if isinstance(got, Refused) and not got.unavailable:
                    log.warning("%s: holds the %s without a slot: %s", self.owner(action), semaphore, got.why)

    async def heartbeat(self) -> None:
        """``beat`` every third of the lease, until cancelled."""
        while True:
            try:
                await self.beat()
            except Exception:  # a bug here must not end the heartbeat
                log.exception("the fleet heartbeat failed")
            await asyncio.sleep(self.config.lease_ttl / 3)


__all__ = ["FALLBACK", "RESTARTS", "FleetGate", "Keeper", "Refused", "Slot"]
