"""A real etcd and a real Redis for the whole session (each test under a prefix of its own), and a
Coordinator on either: the contract tests run once per store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from etcd3gw.client import Etcd3Client
from etcd3gw.lease import Lease

from specguard.coordination.base import Coordinator
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.opening import open_coordinator
from tests.fleetstores import EtcdServer, RedisServer, etcd_server, redis_server

_prefixes = itertools.count(1)


class FakeClock:
    """Unix seconds that move only when told (Redis's scripts take the time from it)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def new_prefix(name: str) -> str:
    return f"test{next(_prefixes)}-{name}/"


def open_on(
    server: EtcdServer | RedisServer, prefix: str, clock: FakeClock | None, timeout: float = 2.0
) -> Coordinator:
    store = "etcd" if isinstance(server, EtcdServer) else "redis"
    config = CoordinationConfig(store=store, url=server.url, prefix=prefix, timeout=timeout)
    return open_coordinator(config, clock)


@dataclass
class Case:
    """One store under test: a Coordinator on it (a fresh prefix), and the means to end a lease."""

    store: str
    server: EtcdServer | RedisServer
    coordinator: Coordinator
    clock: FakeClock  # Redis's time; etcd's leases run on etcd's own clock

    def another(self) -> Coordinator:
        """A second client of the same fleet (same prefix, same clock): another host."""
        return open_on(self.server, self.coordinator.prefix, self.clock)


@pytest.fixture(params=["etcd", "redis"])
async def case(request: pytest.FixtureRequest) -> AsyncIterator[Case]:
    store: str = request.param
    server: EtcdServer | RedisServer = request.getfixturevalue(store)
    clock = FakeClock()
    coordinator = open_on(server, new_prefix(request.node.name), clock)
    yield Case(store, server, coordinator, clock)
    await coordinator.close()


def revoke_holder(server: EtcdServer, prefix: str, semaphore: str, owner: str) -> bool:
    """End the lease of ``owner``'s slot on etcd at once (what etcd does when its TTL runs out);
    False when there is no such slot."""
    client = Etcd3Client(host="127.0.0.1", port=server.port, timeout=5, api_path="/v3/")
    try:
        found = client.get(f"{prefix}sem/{semaphore}/holders/{owner}", metadata=True)
        if not found:
            return False
        Lease(int(found[0][1]["lease"]), client).revoke()
        return True
    finally:
        client.session.close()


async def end_lease(case: Case, semaphore: str, owner: str, ttl: float) -> None:
    """The lease of ``owner``'s slot ends: on Redis the clock passes its ttl (every lease granted
    or renewed at the same time ends too), on etcd its lease is revoked."""
    if case.store == "redis":
        case.clock.advance(ttl + 0.001)
    else:
        assert isinstance(case.server, EtcdServer)
        assert await asyncio.to_thread(revoke_holder, case.server, case.coordinator.prefix, semaphore, owner)
