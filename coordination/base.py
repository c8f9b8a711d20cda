"""The one small interface both stores implement: a named counting semaphore whose slots are leases.

A slot is held by an *owner* (``host:action``) under a lease of ``ttl`` seconds that the holder
renews while its disruption lasts; a holder that crashes stops renewing and its slot frees when the
lease ends. Every grant carries a *fencing token*: a number that grows with every grant of the
store, fleet-wide. A holder checks its token (``holds``) where its step is recorded: a holder
whose lease ended meanwhile (a pause, a partition, the store down) learns that it acted without a
slot, instead of believing it still had one.

Each grant may also be counted against a budget (``Budget``: at most ``count`` grants per
``window`` seconds, fleet-wide), counted in the same atomic step as the grant.

Every call either answers or raises ``Unavailable`` (the store unreachable, timing out, or
answering with an error): the caller treats that as "no new disruption" (fail safe), never as a
grant.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

RESTARTS = "restarts"  # the semaphore a vLLM restart takes a slot of
FALLBACK = "fallback"  # the one a host holding the fallback flag takes (with max_in_fallback)


class Unavailable(Exception):
    """The store could not be asked (unreachable, timed out, or an error): no grant is known."""


@dataclass(frozen=True)
class Budget:
    """At most ``count`` grants in any ``window`` seconds, fleet-wide."""

    count: int
    window: float = 3600.0


@dataclass(frozen=True)
class Holder:
    """One slot held: by whom, under which token, since when, until when unless renewed, and why."""

    owner: str  # host:action
    token: int  # fencing token of the grant
    since: float  # unix time of the grant
    expires: float  # unix time the lease ends unless renewed
    incident: str = ""  # what it is for, as the holder said (rule, series, event)


@dataclass(frozen=True)
class Grant:
    """The answer to ``acquire``: a slot (``token``), or the reason there is none."""

    token: int | None  # None: refused
    holders: tuple[Holder, ...] = ()  # who holds the semaphore now (the new holder included)
    why: str = ""  # refused: why ("2 of 2 slots held by ...", "budget: 6 of 6 in the last 1h")
    budget_used: int | None = None  # grants counted in the budget's window, this one included

    @property
    def granted(self) -> bool:
        return self.token is not None


@dataclass(frozen=True)
class Fleet:
    """What ``specguard fleet status`` shows of one semaphore."""

    semaphore: str
    holders: tuple[Holder, ...]
    hosts: tuple[str, ...]  # the hosts registered (alive) in the fleet
    budget_used: int | None = None  # grants in the budget's window (None: no budget asked)
    notes: tuple[str, ...] = field(default_factory=tuple)


class Coordinator(ABC):
    """A connection to the fleet's store. ``clock`` (unix seconds), when given, replaces the
    store's own time where the store keeps time itself (Redis); a test's fake clock. etcd's
    leases always run on etcd's clock."""

    name: str  # "etcd" | "redis"

    def __init__(self, prefix: str, timeout: float, clock: Callable[[], float] | None = None) -> None:
        self.prefix = prefix  # every key under it: one fleet per prefix
        self.timeout = timeout  # seconds for one call to the store
        self.clock = clock

    @abstractmethod
    async def acquire(
        self, semaphore: str, owner: str, limit: int, ttl: float, incident: str, budget: Budget | None = None
    ) -> Grant:
        """A slot of ``semaphore`` for ``owner`` if fewer than ``limit`` are held (and the budget
        allows), atomically. An owner that already holds one gets it back, renewed, with the
        same token, and counts against nothing again."""

    @abstractmethod
    async def renew(self, semaphore: str, owner: str, token: int, ttl: float) -> bool:
        """Extend the lease of ``owner``'s slot held under ``token`` to ``ttl`` from now; False
        when it is no longer held under that token (its lease ended)."""

    @abstractmethod
    async def release(self, semaphore: str, owner: str, token: int) -> bool:
        """Give the slot back; False when it was no longer held under ``token`` (nothing done)."""

    @abstractmethod
    async def holds(self, semaphore: str, owner: str, token: int) -> bool:
        """The fencing check: ``owner`` still holds its slot under ``token``."""

    @abstractmethod
    async def holders(self, semaphore: str) -> tuple[Holder, ...]:
        """The slots held now (expired leases not counted), oldest grant first."""

    @abstractmethod
    async def budget_used(self, semaphore: str, window: float) -> int:
        """Grants of ``semaphore`` in the last ``window`` seconds."""

    @abstractmethod
    async def register(self, host: str, ttl: float) -> None:
        """This host is in the fleet for ``ttl`` seconds (renewed by calling again)."""

    @abstractmethod
    async def hosts(self) -> tuple[str, ...]:
        """The hosts registered and not expired, sorted."""

    @abstractmethod
    async def close(self) -> None:
        """Let go of the connection (slots held stay until released or expired)."""


def limit_of(spec: int | float, hosts: int) -> int:
    """A limit given as a number of hosts (int) or a share of the registered hosts (float in
    (0, 1]): at least 1, so that a fleet of one can still act."""
    if isinstance(spec, int):
        return spec
    return max(1, int(spec * hosts + 1e-9))
