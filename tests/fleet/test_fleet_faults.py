"""The fleet's faults, with the real stores on loopback: a daemon killed (SIGKILL) while it holds a
restart slot, and the store stopped (SIGSTOP) in the middle of a wave."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from specguard.coordination.base import RESTARTS
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.opening import open_coordinator
from tests.fleethosts import Fleet, FleetHost, started_store
from tests.processes import specguard

TTL = 4.0


async def fleet_status(host: FleetHost) -> dict[str, Any]:
    code, out, err = await specguard("fleet", "status", "--config", str(host.config), "--json")
    assert code == 0, err
    return dict(json.loads(out))


def holders(status: dict[str, Any]) -> list[dict[str, Any]]:
    restarts = [s for s in status["semaphores"] if s["semaphore"] == "restarts"]
    return list(restarts[0]["holders"]) if restarts else []


async def until(what: str, check: Any, seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {what}")


@pytest.mark.parametrize("kind", ["redis", "etcd"])
async def test_a_daemon_killed_holding_a_slot_frees_it_within_its_lease_and_finishes_under_a_fresh_one(
    kind: str, tmp_path: Path
) -> None:
    with started_store(kind, tmp_path / "store") as store:
        coordination = {"store": kind, "url": store.url, "prefix": "kill/", "lease_ttl": f"{TTL:g}s",
                        "retry": "1s", "timeout": "2s", "max_concurrent_restarts": 1}  # fmt: skip
        # each restart takes 6 s or more (the simulator's start): time to look at it while it is under way
        fleet = Fleet(tmp_path, 3, coordination, startup_delay=6.0)
        try:
            await fleet.start()
            watcher = fleet.hosts[0]

            async def restarting() -> FleetHost | None:  # a restart under way, its slot held
                for host in fleet.hosts:
                    if any(r.serving is None for r in host.restarts()):
                        return host
                return None

            victim = await until("a restart under way", restarting, 120)
            (held,) = holders(await fleet_status(watcher))  # as an operator sees it
            assert held["owner"] == f"host-{victim.index}:shrink", held
            old_token = held["token"]
            os.kill(victim.daemon.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            victim.daemon.process.wait()  # type: ignore[union-attr]
            killed = time.time()
            # read in this process from now on (a CLI process takes a second or more to start)
            reader = open_coordinator(CoordinationConfig.model_validate(coordination))
            try:
                (last,) = await reader.holders(RESTARTS)  # no renewal after the kill: its lease's end
                assert (last.owner, last.token) == (held["owner"], old_token)
                assert (
                    last.expires <= killed + TTL + 1.0
                )  # (etcd counts a lease's time left in whole seconds)

                async def freed() -> bool:
                    return all(h.owner != held["owner"] for h in await reader.holders(RESTARTS))

                await until("the killed holder's slot to free", freed, TTL + 10)
                # freed when its lease ended: etcd deletes an ended lease's keys within about a second
                assert time.time() <= last.expires + 2.5, (time.time() - killed, last.expires - killed)
            finally:
                await reader.close()

            async def another_restarted() -> bool:
                return any(r.host != victim.index and r.stopped > killed for r in fleet.restarts())

            await until("the next host's restart", another_restarted, 120)
            victim.daemon.start()  # the killed daemon back: its step completed under a fresh lease

            async def victim_done() -> bool:
                ladder = await victim.ladder()
                return ladder["change"] is None and ladder["k"] == 2

            await until("the killed daemon's step completed", victim_done, 180)
            taken = [line["msg"] for line in victim.logged("took the fleet's restarts slot")]
            tokens = [int(m.rsplit("token ", 1)[1].rstrip(")")) for m in taken]
            assert tokens[0] == old_token and tokens[-1] > old_token, taken
            ladder = await victim.ladder()
            assert "completed after specguard restarted" in ladder["log"][-1]["detail"], ladder["log"]
        finally:
            await fleet.stop()


@pytest.mark.parametrize("kind", ["redis", "etcd"])
async def test_the_store_stopped_mid_wave_holds_new_restarts_and_a_lease_lost_meanwhile_is_paged(
    kind: str, tmp_path: Path
) -> None:
    with started_store(kind, tmp_path / "store") as store:
        coordination = {"store": kind, "url": store.url, "prefix": "stop/", "lease_ttl": f"{TTL:g}s",
                        "retry": "1s", "timeout": "1s", "max_concurrent_restarts": 1}  # fmt: skip
        fleet = Fleet(tmp_path, 3, coordination, startup_delay=8.0)
        try:
            await fleet.start()

            async def first() -> bool:
                return bool(fleet.restarts())

            await until("the first restart", first, 120)
            store.pause()  # the process stopped: every call times out
            paused = time.time()
            await asyncio.sleep(TTL + 2)  # longer than the lease: the holder's lease ends meanwhile
            begun = [r for r in fleet.restarts() if r.stopped > paused]
            assert begun == [], f"a restart began with the store stopped: {begun}"
            store.resume()

            async def all_done() -> bool:
                done = [r for r in fleet.restarts() if r.serving is not None]
                return len({r.host for r in done}) == 3

            await fleet.watch(all_done, seconds=240)
            first_host = min(fleet.restarts(), key=lambda r: r.stopped).host
            ladder = await fleet.hosts[first_host].ladder()
            first_step = ladder["log"][0]["detail"]
            print(f"{kind}: the first step: {first_step}")
            assert "done without a fleet slot" in first_step, first_step
            # the deferred ones said why while the store was stopped
            waited = [h for h in fleet.hosts if h.logged("cannot be reached")]
            assert waited, "no host said the store could not be reached"
        finally:
            await fleet.stop()
