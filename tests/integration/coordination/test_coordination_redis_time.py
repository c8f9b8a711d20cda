"""Redis keeps time for the fleet: leases, the budget's window and host registrations end by
Redis's clock (here a fake one, passed to the scripts), and by its own TIME when none is given."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from specguard.coordination.base import RESTARTS, Budget, Coordinator
from tests.fleetstores import RedisServer
from tests.integration.coordination.conftest import FakeClock, new_prefix, open_on

pytestmark = pytest.mark.real


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def coordinator(
    redis: RedisServer, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[Coordinator]:
    c = open_on(redis, new_prefix(request.node.name), clock)
    yield c
    await c.close()


async def test_a_lease_ends_at_its_ttl_unless_renewed(coordinator: Coordinator, clock: FakeClock) -> None:
    c = coordinator
    a = await c.acquire(RESTARTS, "a:vllm_restart", 2, 30, "")
    b = await c.acquire(RESTARTS, "b:vllm_restart", 2, 30, "")
    assert a.token is not None and b.token is not None
    assert [h.expires for h in b.holders] == [clock.now + 30, clock.now + 30]

    clock.advance(20)
    assert await c.renew(RESTARTS, "a:vllm_restart", a.token, 30)
    clock.advance(9.999)
    assert await c.holds(RESTARTS, "b:vllm_restart", b.token)
    clock.advance(0.001)  # b's 30 s are up; a was renewed 10 s ago
    assert not await c.holds(RESTARTS, "b:vllm_restart", b.token)
    assert [h.owner for h in await c.holders(RESTARTS)] == ["a:vllm_restart"]
    assert (await c.holders(RESTARTS))[0].expires == clock.now + 20
    assert (await c.acquire(RESTARTS, "c:vllm_restart", 2, 30, "")).granted


async def test_the_budget_frees_a_grant_when_its_window_has_passed(
    coordinator: Coordinator, clock: FakeClock
) -> None:
    c = coordinator
    budget = Budget(count=2, window=600)
    for owner in ("a", "b"):
        grant = await c.acquire(RESTARTS, f"{owner}:vllm_restart", 5, 30, "", budget)
        assert grant.token is not None
        assert await c.release(RESTARTS, f"{owner}:vllm_restart", grant.token)
        clock.advance(100)
    # the grants were at t0 and t0+100; now t0+200
    clock.advance(399.999)
    refused = await c.acquire(RESTARTS, "c:vllm_restart", 5, 30, "", budget)
    assert refused.why == "budget: 2 of 2 in the last 10m"
    clock.advance(0.001)  # the first grant is 600 s old: out of the window
    assert await c.budget_used(RESTARTS, 600) == 1
    granted = await c.acquire(RESTARTS, "c:vllm_restart", 5, 30, "", budget)
    assert granted.granted and granted.budget_used == 2


async def test_hosts_drop_out_when_their_registration_ends(
    coordinator: Coordinator, clock: FakeClock
) -> None:
    c = coordinator
    await c.register("web-1", 10)
    await c.register("web-2", 20)
    clock.advance(10)
    assert await c.hosts() == ("web-2",)
    await c.register("web-1", 10)
    assert await c.hosts() == ("web-1", "web-2")


async def test_without_a_clock_redis_keeps_the_time(
    redis: RedisServer, request: pytest.FixtureRequest
) -> None:
    c = open_on(redis, new_prefix(request.node.name), clock=None)
    try:
        before = time.time()
        grant = await c.acquire(RESTARTS, "a:vllm_restart", 1, 0.4, "")
        assert grant.token is not None
        holder = grant.holders[0]
        # Redis reads the same system clock as this test, at millisecond precision.
        assert before - 0.002 <= holder.since <= time.time() + 0.002
        assert holder.expires == pytest.approx(holder.since + 0.4, abs=0.0015)
        await asyncio.sleep(0.6)
        assert not await c.holds(RESTARTS, "a:vllm_restart", grant.token)
        assert await c.holders(RESTARTS) == ()
    finally:
        await c.close()
