"""The actions' side of fleet coordination, against a real Redis on loopback: a restart takes a slot
before anything changes and gives it back once verified; without one it defers (nothing written,
nothing restarted, no journal), and with the store stopped it defers and pages once per outage, not
at every retry; a fallback past max_in_fallback is refused and paged, the flag left as it is, and a
restore gives its slot back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from specguard.actions.base import ActionContext
from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.vllm_restart import VllmRestartAction, speculative
from specguard.actions.vllm_restart.change import STATE_KEY
from specguard.actions.vllm_restart.server import Server
from specguard.coordination.base import FALLBACK, RESTARTS
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.gate import FleetGate, Refused, Slot
from specguard.coordination.opening import open_coordinator
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from tests.fleetstores import RedisServer, redis_server
from tests.vllm_host import DRAFT, Host


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as server:
        yield server


def gate(server: RedisServer, host: str, **limits: object) -> FleetGate:
    config = CoordinationConfig.model_validate({"store": "redis", "url": server.url, "host": host, "retry": "7s",
                                                "timeout": "1s", "lease_ttl": "10s", **limits})  # fmt: skip
    return FleetGate(open_coordinator(config), config)


def firing(store: Store, event_id: int) -> ActionContext:
    return ActionContext(
        rule="acceptance_critical", event="firing", severity="critical", labels={}, value=0.1, threshold=0.3,
        summary="acceptance low", event_id=event_id, memory=StoreMemory(store, "shrink"),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def restarting(
    tmp_path: Path, store: Store, redis: RedisServer, **limits: object
) -> AsyncIterator[tuple[Host, FleetGate, VllmRestartAction]]:
    """A simulator host served as ``env``, its ``vllm_restart`` action coordinated through a gate
    named gpu-1 (``limits``: the coordination section's), once the server is up; all stopped after."""
    host = Host(tmp_path, "env")
    host.start()
    ours = gate(redis, "gpu-1", **limits)
    try:
        action = host.action()
        action.coordinate(ours, StoreMemory(store, "shrink"))
        await Server(host.url, None).wait_healthy(30)
        yield host, ours, action
    finally:
        host.stop()
        await ours.coordinator.close()


async def test_a_restart_waits_for_a_slot_takes_it_and_gives_it_back(
    tmp_path: Path, store: Store, redis: RedisServer
) -> None:
    theirs = gate(redis, "gpu-2", max_concurrent_restarts=1)
    async with restarting(tmp_path, store, redis, max_concurrent_restarts=1) as (host, ours, action):
        try:
            other = await theirs.take(RESTARTS, "shrink", "k 4 -> 2: acceptance_critical firing")
            assert isinstance(other, Slot), other

            deferred = await action.run(firing(store, 1))
            assert (deferred.ok, deferred.retry_after, deferred.page) == (False, 7.0, False)
            assert deferred.detail.startswith("deferred: 1 of 1 slots held by gpu-2:shrink (token"), (
                deferred.detail
            )
            assert len(host.commands()) == 1  # never restarted without a slot
            state = await StoreMemory(store, "shrink").read(STATE_KEY)
            assert state is None or state["change"] is None  # no journal opened
            assert speculative.read_env(host.path.read_text(), "f") == DRAFT  # nothing written

            await theirs.give_back(other)
            done = await action.run(firing(store, 1))  # the run tried again
            assert done.ok and "k 4 -> 2" in done.detail and not done.page, done.detail
            assert len(host.commands()) == 2
            assert await ours.coordinator.holders(RESTARTS) == ()  # given back once verified
            log = (await action.show(StoreMemory(store, "shrink")))["log"]
            assert [(e["from"], e["to"], e["ok"]) for e in log] == [(4, 2, True)]
        finally:
            await theirs.coordinator.close()


async def test_a_slot_that_ended_before_the_step_began_stops_it_before_anything_is_written(
    tmp_path: Path, store: Store, redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder paused past its lease between taking its slot and acting (here: the slot given
    back under it at once): its fencing token no longer holds, so nothing is written or restarted;
    the run is deferred and takes a slot again."""
    async with restarting(tmp_path, store, redis, max_concurrent_restarts=1) as (host, ours, action):
        take = ours.take

        async def taken_then_lost(semaphore: str, name: str, incident: str) -> Slot | Refused:
            got = await take(semaphore, name, incident)
            assert isinstance(got, Slot)
            await ours.give_back(got)  # its lease is over before the step begins
            return got

        monkeypatch.setattr(ours, "take", taken_then_lost)
        stopped = await action.run(firing(store, 1))
        assert (stopped.ok, stopped.retry_after, stopped.page) == (False, 7.0, False)
        assert stopped.detail.startswith("deferred: k 4 -> 2 not started: its restarts slot (token "), (
            stopped.detail
        )
        assert "had ended" in stopped.detail
        assert len(host.commands()) == 1 and speculative.read_env(host.path.read_text(), "f") == DRAFT
        assert (await StoreMemory(store, "shrink").read(STATE_KEY))["change"] is None  # the journal closed
        monkeypatch.setattr(ours, "take", take)
        done = await action.run(firing(store, 1))  # tried again: a slot of its own this time
        assert done.ok and "k 4 -> 2" in done.detail and "without a fleet slot" not in done.detail, (
            done.detail
        )


async def test_with_the_store_stopped_a_restart_defers_and_pages_once_per_outage(
    tmp_path: Path, store: Store, redis: RedisServer
) -> None:
    async with restarting(tmp_path, store, redis, max_concurrent_restarts=2) as (host, ours, action):
        redis.pause()
        first = await action.run(firing(store, 1))
        again = await action.run(firing(store, 1))
        assert (first.ok, first.page, again.ok, again.page) == (False, True, False, False)
        assert "the fleet's redis" in first.detail and "cannot be reached" in first.detail
        assert "no new disruption while it is down" in first.detail
        assert len(host.commands()) == 1 and ours.unavailable_since is not None
        redis.resume()
        done = await action.run(firing(store, 1))
        assert done.ok and ours.unavailable_since is None, done.detail
        redis.pause()
        later = await action.run(firing(store, 2))  # a new outage: told again
        assert (later.ok, later.page) == (False, True)
        redis.resume()


async def test_a_fallback_past_max_in_fallback_pages_instead_and_a_restore_gives_its_slot_back(
    tmp_path: Path, store: Store, redis: RedisServer
) -> None:
    def flag(name: str, path: Path) -> FeatureFlagAction:
        return FeatureFlagAction(name, FeatureFlagParams.model_validate(
            {"type": "feature_flag", "file": {"path": str(path), "engage": {"fallback": True}, "restore": {"fallback": False}}}
        ))  # fmt: skip

    first, second = flag("fallback", tmp_path / "a.json"), flag("fallback", tmp_path / "b.json")
    gates = [gate(redis, "gpu-1", max_in_fallback=1), gate(redis, "gpu-2", max_in_fallback=1)]
    memories = [StoreMemory(store, "fallback-a"), StoreMemory(store, "fallback-b")]
    try:
        first.coordinate(gates[0], memories[0])
        second.coordinate(gates[1], memories[1])
        engaged = await first.engage(memories[0])
        assert engaged.ok, engaged.detail
        refused = await second.engage(memories[1])
        assert (refused.ok, refused.page, refused.retry_after) == (False, True, 7.0)
        assert refused.detail.startswith("not falling back: 1 of 1 slots held by gpu-1:fallback"), (
            refused.detail
        )
        assert "on-call is paged instead" in refused.detail
        assert not (tmp_path / "b.json").exists()  # the flag left as it is
        # the heartbeat keeps what the engaged flag should hold, and registers the hosts
        await gates[0].beat()
        (first_slot,) = await gates[0].coordinator.holders(FALLBACK)
        assert first_slot.owner == "gpu-1:fallback"
        # its lease lost (as while the store was down): the heartbeat takes it again, a new token
        assert await gates[0].coordinator.release(FALLBACK, first_slot.owner, first_slot.token)
        await gates[0].beat()
        (again_slot,) = await gates[0].coordinator.holders(FALLBACK)
        assert again_slot.owner == "gpu-1:fallback" and again_slot.token > first_slot.token
        assert await gates[0].coordinator.hosts() == ("gpu-1",)
        restored = await first.restore_flag(memories[0], canary=False)
        assert restored.ok, restored.detail
        assert await gates[0].coordinator.holders(FALLBACK) == ()  # the slot held now given back
        assert (await second.engage(memories[1])).ok  # a slot is free now
        # the store stopped: a restore needs no slot and goes on (its slot ends with its lease)
        redis.pause()
        try:
            back = await second.restore_flag(memories[1], canary=False)
            assert back.ok and "speculative decoding restored" in back.detail, back.detail
            assert json.loads((tmp_path / "b.json").read_text()) == {"fallback": False}
            again = await first.engage(memories[0])  # ...while a new fallback is refused, and paged
            assert (again.ok, again.page) == (False, True) and "cannot be reached" in again.detail
        finally:
            redis.resume()
    finally:
        for g in gates:
            await g.coordinator.close()
