"""etcd keeps time for the fleet with its leases: these wait for real ones (of 2-4 s; etcd's
shortest are about 2 s) to end, be kept alive, or move to a lease of another ttl."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from specguard.coordination.base import RESTARTS, Budget, Coordinator
from tests.fleetstores import EtcdServer
from tests.integration.coordination.conftest import new_prefix, open_on

pytestmark = pytest.mark.real


@pytest.fixture
async def coordinator(etcd: EtcdServer, request: pytest.FixtureRequest) -> AsyncIterator[Coordinator]:
    c = open_on(etcd, new_prefix(request.node.name), clock=None)
    yield c
    await c.close()


async def eventually(check: Callable[[], Awaitable[bool]], within: float) -> float:
    """Seconds until ``check`` is true; fails after ``within``."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, f"still not true after {within}s"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_an_unrenewed_lease_ends_by_itself_and_frees_the_slot(coordinator: Coordinator) -> None:
    c = coordinator
    a = await c.acquire(RESTARTS, "a:vllm_restart", 1, 2, "")
    granted = time.monotonic()
    assert a.token is not None
    token = a.token
    assert not (await c.acquire(RESTARTS, "b:vllm_restart", 1, 2, "")).granted

    async def ended() -> bool:
        return not await c.holds(RESTARTS, "a:vllm_restart", token)

    await eventually(ended, within=8)
    # Held about its 2 s: they ran from the lease's grant, a little before the acquire answered.
    assert time.monotonic() - granted > 1.0
    assert await c.holders(RESTARTS) == ()
    assert not await c.renew(RESTARTS, "a:vllm_restart", a.token, 2)
    back = await c.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")
    assert back.token is not None and back.token > a.token
    assert not await c.holds(RESTARTS, "a:vllm_restart", a.token)


async def test_a_renewed_lease_outlives_its_ttl_and_can_change_ttl(coordinator: Coordinator) -> None:
    c = coordinator
    a = await c.acquire(RESTARTS, "a:vllm_restart", 1, 4, "")
    assert a.token is not None
    await asyncio.sleep(2.5)
    assert await c.renew(RESTARTS, "a:vllm_restart", a.token, 4)  # a keep-alive of its lease
    await asyncio.sleep(2.5)  # 5 s since the grant: its first 4 s are over
    assert await c.holds(RESTARTS, "a:vllm_restart", a.token)

    assert await c.renew(RESTARTS, "a:vllm_restart", a.token, 60)  # moves to a lease of 60 s
    (holder,) = await c.holders(RESTARTS)
    assert holder.token == a.token
    assert holder.expires - time.time() > 50  # etcd's own count of the lease's time left
    assert await c.holds(RESTARTS, "a:vllm_restart", a.token)
    assert await c.release(RESTARTS, "a:vllm_restart", a.token)


async def test_the_budget_frees_a_grant_when_its_window_has_passed(coordinator: Coordinator) -> None:
    c = coordinator
    budget = Budget(count=1, window=2)
    a = await c.acquire(RESTARTS, "a:vllm_restart", 5, 30, "", budget)
    assert a.token is not None and a.budget_used == 1
    assert await c.release(RESTARTS, "a:vllm_restart", a.token)
    refused = await c.acquire(RESTARTS, "b:vllm_restart", 5, 30, "", budget)
    assert refused.why == "budget: 1 of 1 in the last 2s"

    async def freed() -> bool:
        return await c.budget_used(RESTARTS, 2) == 0

    await eventually(freed, within=8)
    b = await c.acquire(RESTARTS, "b:vllm_restart", 5, 30, "", budget)
    assert b.granted and b.budget_used == 1


async def test_hosts_drop_out_when_their_registration_ends(coordinator: Coordinator) -> None:
    c = coordinator
    await c.register("web-1", 2)
    await c.register("web-2", 30)
    await c.register("web-2", 30)  # again: a keep-alive of its lease
    assert await c.hosts() == ("web-1", "web-2")

    async def gone() -> bool:
        return await c.hosts() == ("web-2",)

    await eventually(gone, within=8)
