"""The Coordinator contract, against a real etcd and a real Redis alike: a counting semaphore of
leased slots, fencing tokens, a budget, the hosts of the fleet."""

from __future__ import annotations

import asyncio

import pytest

from specguard.coordination.base import RESTARTS, Budget, Grant, limit_of
from tests.integration.coordination.conftest import Case, end_lease

pytestmark = pytest.mark.real

TTL = 30.0


async def test_grants_up_to_the_limit_then_refuses_naming_the_holders(case: Case) -> None:
    c = case.coordinator
    first = await c.acquire(RESTARTS, "a:vllm_restart", 2, TTL, "rule acceptance_collapse")
    second = await c.acquire(RESTARTS, "b:vllm_restart", 2, TTL, "rule acceptance_collapse")
    third = await c.acquire(RESTARTS, "c:vllm_restart", 2, TTL, "rule acceptance_collapse")

    assert first.granted and second.granted and not third.granted
    assert third.token is None
    assert [h.owner for h in third.holders] == ["a:vllm_restart", "b:vllm_restart"]
    assert third.why == (
        f"2 of 2 slots held by a:vllm_restart (token {first.token}, for: rule acceptance_collapse), "
        f"b:vllm_restart (token {second.token}, for: rule acceptance_collapse)"
    )
    assert [h.owner for h in second.holders] == ["a:vllm_restart", "b:vllm_restart"]  # the new one included
    assert [h.owner for h in await c.holders(RESTARTS)] == ["a:vllm_restart", "b:vllm_restart"]


async def test_another_semaphore_has_its_own_slots(case: Case) -> None:
    c = case.coordinator
    assert (await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "")).granted
    assert (await c.acquire("fallback", "b:feature_flag", 1, TTL, "")).granted
    assert not (await c.acquire(RESTARTS, "b:vllm_restart", 1, TTL, "")).granted


async def test_an_owner_that_holds_gets_its_slot_back_with_the_same_token_and_no_budget(case: Case) -> None:
    c = case.coordinator
    budget = Budget(count=5, window=3600)
    first = await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "first", budget)
    again = await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "second", budget)

    assert first.granted and again.token == first.token
    assert first.budget_used == 1 and again.budget_used == 1
    assert await c.budget_used(RESTARTS, 3600) == 1
    assert [(h.owner, h.token, h.incident) for h in await c.holders(RESTARTS)] == [
        ("a:vllm_restart", first.token, "first")
    ]


async def test_a_release_frees_the_slot(case: Case) -> None:
    c = case.coordinator
    a = await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "")
    assert a.token is not None
    assert not (await c.acquire(RESTARTS, "b:vllm_restart", 1, TTL, "")).granted

    assert await c.release(RESTARTS, "a:vllm_restart", a.token)
    assert await c.holders(RESTARTS) == ()
    assert not await c.holds(RESTARTS, "a:vllm_restart", a.token)
    assert (await c.acquire(RESTARTS, "b:vllm_restart", 1, TTL, "")).granted
    assert not await c.release(RESTARTS, "a:vllm_restart", a.token)  # already given back


async def test_tokens_grow_strictly_with_every_grant_across_semaphores_and_clients(case: Case) -> None:
    other = case.another()
    try:
        tokens = []
        for i in range(6):
            coordinator = case.coordinator if i % 2 else other
            semaphore = RESTARTS if i % 3 else "fallback"
            grant = await coordinator.acquire(semaphore, f"h{i}:vllm_restart", 10, TTL, "")
            assert grant.token is not None
            tokens.append(grant.token)
            if i == 3:
                assert await coordinator.release(semaphore, f"h{i}:vllm_restart", grant.token)
        again = await case.coordinator.acquire(RESTARTS, "h3:vllm_restart", 10, TTL, "")
        assert again.token is not None
        tokens.append(again.token)
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    finally:
        await other.close()


async def test_a_wrong_or_stale_token_neither_renews_releases_nor_holds(case: Case) -> None:
    c = case.coordinator
    a = await c.acquire(RESTARTS, "a:vllm_restart", 2, TTL, "")
    b = await c.acquire(RESTARTS, "b:vllm_restart", 2, TTL, "")
    assert a.token is not None and b.token is not None

    for wrong in (a.token + 1000, b.token, 0):
        assert not await c.holds(RESTARTS, "a:vllm_restart", wrong)
        assert not await c.renew(RESTARTS, "a:vllm_restart", wrong, TTL)
        assert not await c.release(RESTARTS, "a:vllm_restart", wrong)
    assert not await c.holds(RESTARTS, "nobody:vllm_restart", a.token)
    assert await c.holds(RESTARTS, "a:vllm_restart", a.token)  # none of it touched the slot
    assert await c.renew(RESTARTS, "a:vllm_restart", a.token, TTL)

    assert await c.release(RESTARTS, "a:vllm_restart", a.token)
    again = await c.acquire(RESTARTS, "a:vllm_restart", 2, TTL, "")
    assert again.token is not None and again.token > a.token
    assert not await c.holds(RESTARTS, "a:vllm_restart", a.token)  # stale: from the earlier grant
    assert not await c.renew(RESTARTS, "a:vllm_restart", a.token, TTL)
    assert not await c.release(RESTARTS, "a:vllm_restart", a.token)
    assert await c.holds(RESTARTS, "a:vllm_restart", again.token)


async def test_an_ended_lease_frees_the_slot_and_its_old_token_never_holds_again(case: Case) -> None:
    """Redis: the fake clock passes the ttl; etcd: the lease is revoked, as etcd does at its TTL
    (test_coordination_etcd_leases waits for a real one)."""
    c = case.coordinator
    a = await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "")
    assert a.token is not None
    await end_lease(case, RESTARTS, "a:vllm_restart", TTL)

    assert not await c.holds(RESTARTS, "a:vllm_restart", a.token)
    assert not await c.renew(RESTARTS, "a:vllm_restart", a.token, TTL)
    assert await c.holders(RESTARTS) == ()
    b = await c.acquire(RESTARTS, "b:vllm_restart", 1, TTL, "")
    assert b.token is not None and b.token > a.token
    assert await c.release(RESTARTS, "b:vllm_restart", b.token)

    back = await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "")
    assert back.token is not None and back.token > b.token
    assert not await c.holds(RESTARTS, "a:vllm_restart", a.token)
    assert not await c.release(RESTARTS, "a:vllm_restart", a.token)
    assert await c.holds(RESTARTS, "a:vllm_restart", back.token)


async def test_the_budget_refuses_past_its_count_even_with_slots_free(case: Case) -> None:
    c = case.coordinator
    budget = Budget(count=2, window=3600)
    grants = []
    for owner in ("a", "b", "c"):
        grant = await c.acquire(RESTARTS, f"{owner}:vllm_restart", 5, TTL, "", budget)
        grants.append(grant)
        if grant.token is not None:
            assert await c.release(RESTARTS, f"{owner}:vllm_restart", grant.token)

    assert [g.granted for g in grants] == [True, True, False]
    assert [g.budget_used for g in grants] == [1, 2, 2]
    assert grants[2].why == "budget: 2 of 2 in the last 1h"
    assert await c.budget_used(RESTARTS, 3600) == 2
    assert (await c.acquire(RESTARTS, "c:vllm_restart", 5, TTL, "")).granted  # no budget asked


async def test_a_full_semaphore_is_named_before_the_budget(case: Case) -> None:
    c = case.coordinator
    budget = Budget(count=1, window=3600)
    assert (await c.acquire(RESTARTS, "a:vllm_restart", 1, TTL, "", budget)).granted
    refused = await c.acquire(RESTARTS, "b:vllm_restart", 1, TTL, "", budget)
    assert refused.why.startswith("1 of 1 slots held by a:vllm_restart")
    assert refused.budget_used == 1


async def test_hosts_register_sorted_and_renew(case: Case) -> None:
    c = case.coordinator
    for host in ("web-3", "web-1", "web-2", "web-1"):
        await c.register(host, TTL)
    assert await c.hosts() == ("web-1", "web-2", "web-3")
    other = case.another()
    try:
        assert await other.hosts() == ("web-1", "web-2", "web-3")  # the fleet's view, not one client's
    finally:
        await other.close()


async def test_a_share_of_the_registered_hosts_is_the_limit(case: Case) -> None:
    c = case.coordinator
    for i in range(5):
        await c.register(f"web-{i}", TTL)
    limit = limit_of(0.5, len(await c.hosts()))
    assert limit == 2
    grants = [await c.acquire(RESTARTS, f"web-{i}:vllm_restart", limit, TTL, "") for i in range(5)]
    assert [g.granted for g in grants] == [True, True, False, False, False]


async def test_concurrent_acquires_never_exceed_the_limit(case: Case) -> None:
    clients = [case.another() for _ in range(4)]
    try:
        grants: list[Grant] = await asyncio.gather(
            *(clients[i % 4].acquire(RESTARTS, f"h{i}:vllm_restart", 3, TTL, "") for i in range(24))
        )
    finally:
        for client in clients:
            await client.close()
    granted = sorted(f"h{i}:vllm_restart" for i, g in enumerate(grants) if g.granted)
    assert 1 <= len(granted) <= 3
    if case.store == "redis":
        assert len(granted) == 3  # each script runs alone: no conflicts to give up on
    assert sorted(h.owner for h in await case.coordinator.holders(RESTARTS)) == granted
    tokens = [g.token for g in grants if g.token is not None]
    assert len(set(tokens)) == len(tokens)
    for g in grants:
        assert g.granted or g.why.startswith(("3 of 3 slots held by", "contended:"))


async def test_names_are_unicode_and_may_hold_slashes(case: Case) -> None:
    c = case.coordinator
    owner = "wéb-ß/1:vllm_restart"
    grant = await c.acquire("redémarrages", owner, 1, TTL, "règle « acceptance »")
    assert grant.token is not None
    assert [(h.owner, h.incident) for h in await c.holders("redémarrages")] == [
        (owner, "règle « acceptance »")
    ]
    assert await c.holds("redémarrages", owner, grant.token)
    assert await c.renew("redémarrages", owner, grant.token, TTL)
    assert not (await c.acquire("redémarrages", "other:vllm_restart", 1, TTL, "")).granted
    await c.register("wéb-ß", TTL)
    assert await c.hosts() == ("wéb-ß",)
    assert await c.release("redémarrages", owner, grant.token)
