"""Interleavings of several owners acquiring, renewing, releasing, crashing (no longer renewing,
their token forgotten) and having their leases end, against the real stores, checked step by step
against a model of the semaphore: never more than ``LIMIT`` holders, exactly the holders the model
expects, tokens that only grow, and a holder whose lease ended never passes ``holds`` (nor
renews or releases) with its old token, even after it acquired again.

Redis: time is a fake clock the steps move (leases end when it passes them). etcd: its leases run
on its own clock, so a lease ends by revocation, which is what etcd does at its TTL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specguard.coordination.base import RESTARTS, Coordinator
from tests.fleetstores import EtcdServer, RedisServer
from tests.integration.coordination.conftest import FakeClock, new_prefix, open_on, revoke_holder

LIMIT = 2
TTL = 30.0
OWNERS = ("a:vllm_restart", "b:vllm_restart", "c:vllm_restart")

OWNER = st.integers(0, len(OWNERS) - 1)
COMMON = [
    st.tuples(st.just("acquire"), OWNER),
    st.tuples(st.just("acquire"), OWNER),  # twice as likely: it is what makes the rest happen
    st.tuples(st.just("renew"), OWNER),
    st.tuples(st.just("release"), OWNER),
    st.tuples(st.just("crash"), OWNER),
    st.tuples(st.just("stale"), OWNER),
]
REDIS_STEPS = st.lists(
    st.one_of(*COMMON, st.tuples(st.just("advance"), st.sampled_from([1.0, 10.0, 29.999, 30.0, 45.0]))),
    min_size=1,
    max_size=30,
)
ETCD_STEPS = st.lists(st.one_of(*COMMON, st.tuples(st.just("expire"), OWNER)), min_size=1, max_size=20)


@dataclass
class Model:
    """What the semaphore must look like."""

    now: float
    holders: dict[str, tuple[int, float]] = field(default_factory=dict)  # owner -> (token, expiry)
    believed: dict[str, int] = field(default_factory=dict)  # what each live owner thinks it holds
    ended: dict[str, set[int]] = field(default_factory=dict)  # tokens whose slot ended, per owner
    last_token: int = 0

    def end(self, owner: str) -> None:
        token, _ = self.holders.pop(owner)
        self.ended.setdefault(owner, set()).add(token)

    def pass_time(self, seconds: float) -> None:
        self.now += seconds
        for owner, (_, expiry) in list(self.holders.items()):
            if expiry <= self.now:
                self.end(owner)


async def play(
    steps: list[tuple[str, object]],
    clients: dict[str, Coordinator],
    model: Model,
    clock: FakeClock | None,
    etcd: EtcdServer | None,
) -> None:
    for kind, arg in steps:
        if kind == "advance":
            assert clock is not None and isinstance(arg, float)
            clock.advance(arg)
            model.pass_time(arg)
            continue
        assert isinstance(arg, int)
        owner = OWNERS[arg]
        c = clients[owner]
        held = model.holders.get(owner)
        mine = model.believed.get(owner)
        if kind == "acquire":
            grant = await c.acquire(RESTARTS, owner, LIMIT, TTL, f"step {kind}")
            if held is not None:  # it holds (maybe after a crash): the same slot, renewed
                assert grant.token == held[0]
                model.holders[owner] = (held[0], model.now + TTL)
            elif len(model.holders) < LIMIT:
                assert grant.token is not None and grant.token > model.last_token
                model.last_token = grant.token
                model.holders[owner] = (grant.token, model.now + TTL)
            else:
                assert grant.token is None and grant.why.startswith(f"{LIMIT} of {LIMIT} slots held by")
            if grant.token is not None:
                model.believed[owner] = grant.token
        elif kind == "renew" and mine is not None:
            expected = held is not None and held[0] == mine
            assert await c.renew(RESTARTS, owner, mine, TTL) == expected
            if expected:
                model.holders[owner] = (mine, model.now + TTL)
        elif kind == "release" and mine is not None:
            expected = held is not None and held[0] == mine
            assert await c.release(RESTARTS, owner, mine) == expected
            if expected:
                model.end(owner)
            del model.believed[owner]
        elif kind == "crash":
            model.believed.pop(owner, None)  # stops renewing; its slot stays until its lease ends
        elif kind == "expire" and held is not None:
            assert etcd is not None
            assert await asyncio.to_thread(revoke_holder, etcd, c.prefix, RESTARTS, owner)
            model.end(owner)
        elif kind == "stale":
            for token in model.ended.get(owner, ()):
                assert not await c.holds(RESTARTS, owner, token)
                assert not await c.renew(RESTARTS, owner, token, TTL)
                assert not await c.release(RESTARTS, owner, token)
        await check(c, model)
    for owner, tokens in model.ended.items():  # last, every ended token tried: nothing changes
        for token in tokens:
            assert not await clients[owner].renew(RESTARTS, owner, token, TTL)
            assert not await clients[owner].release(RESTARTS, owner, token)
    await check(clients[OWNERS[0]], model)


async def check(c: Coordinator, model: Model) -> None:
    """The store's holders are the model's; each passes ``holds``, no ended token does."""
    holders = await c.holders(RESTARTS)
    assert len(holders) <= LIMIT
    assert {h.owner: h.token for h in holders} == {o: t for o, (t, _) in model.holders.items()}
    for owner, (token, _) in model.holders.items():
        assert await c.holds(RESTARTS, owner, token)
    for owner, tokens in model.ended.items():
        for token in tokens:
            assert not await c.holds(RESTARTS, owner, token)


async def run(
    server: RedisServer | EtcdServer, steps: list[tuple[str, object]], clock: FakeClock | None
) -> None:
    prefix = new_prefix("interleavings")
    clients = {owner: open_on(server, prefix, clock) for owner in OWNERS}
    try:
        model = Model(now=clock() if clock is not None else 0.0)
        await play(steps, clients, model, clock, server if isinstance(server, EtcdServer) else None)
    finally:
        for client in clients.values():
            await client.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=REDIS_STEPS)
def test_interleavings_on_redis(redis: RedisServer, steps: list[tuple[str, object]]) -> None:
    asyncio.run(run(redis, steps, FakeClock()))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ETCD_STEPS)
def test_interleavings_on_etcd(etcd: EtcdServer, steps: list[tuple[str, object]]) -> None:
    asyncio.run(run(etcd, steps, None))
