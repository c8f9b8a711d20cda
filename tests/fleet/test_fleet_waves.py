"""Eight hosts, each a simulator with its own specguard daemon and ladder, all seeing the same
collapse at the same moment, coordinated through a real etcd and a real Redis on loopback with
``max_concurrent_restarts: 2``: never more than two restarting at once (as the simulators' own
lifecycle logs say, sampled while it happens), every host stepped down in the end, in waves."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fleethosts import Fleet, most_at_once, started_store, waves
from tests.fleetstores import StoreServer


@pytest.mark.parametrize("kind", ["redis", "etcd"])
async def test_eight_hosts_collapsing_at_once_restart_at_most_two_at_a_time(
    kind: str, tmp_path: Path
) -> None:
    with started_store(kind, tmp_path / "store") as store:
        # each restart takes 3 s or more (the simulator's start), so that hosts wanting one at once overlap
        fleet = Fleet(tmp_path, 8, coordination(kind, store, max_concurrent_restarts=2), startup_delay=3.0)
        try:
            await fleet.start()

            async def all_stepped_down() -> bool:
                done = [r for r in fleet.restarts() if r.serving is not None]
                return len({r.host for r in done}) == 8

            seen_at_once = await fleet.watch(all_stepped_down, seconds=240)
            for host in fleet.hosts:
                ladder = await host.ladder()
                assert ladder["k"] == 2 and ladder["change"] is None, (host.index, ladder)
            restarts = fleet.restarts()  # (before the servers are stopped at the end)
        finally:
            await fleet.stop()
    assert len(restarts) == 8, restarts  # one step each: nothing done twice
    assert seen_at_once <= 2 and most_at_once(restarts, time.time()) == 2, restarts
    grouped = waves(restarts)
    first = min(r.stopped for r in restarts)
    print(f"{kind}: waves {grouped}; restarts (s from the first): " + ", ".join(
        f"host-{r.host} {r.stopped - first:.1f}-{(r.serving or 0) - first:.1f}" for r in sorted(restarts, key=lambda r: r.stopped)
    ))  # fmt: skip
    assert len(grouped) >= 4 and all(len(w) <= 2 for w in grouped), grouped
    # each restart took a slot first, and gave it back: the daemons' own logs say so
    for host in fleet.hosts:
        assert host.logged("took the fleet's restarts slot"), host.index


def coordination(kind: str, store: StoreServer, **limits: object) -> dict[str, object]:
    return {"store": kind, "url": store.url, "prefix": f"t{time.monotonic_ns()}/", "lease_ttl": "6s",
            "retry": "1s", "timeout": "2s", **limits}  # fmt: skip
