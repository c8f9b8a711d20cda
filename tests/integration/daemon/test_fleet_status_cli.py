"""`specguard fleet status` against a real Redis: who holds slots, under which token, for which
incident, the budget used and the hosts; the store down is exit 1 with why; a config without a
coordination: section, or with a password that cannot be read, is exit 2 naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

from specguard.coordination.base import RESTARTS
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.gate import FleetGate, Slot
from specguard.coordination.opening import open_coordinator
from tests.fleetstores import redis_server
from tests.ports import free_port
from tests.processes import specguard


def write(tmp_path: Path, coordination: dict[str, object] | None) -> Path:
    config = tmp_path / "specguard.yaml"
    body: dict[str, object] = {"state_dir": "state"}
    if coordination is not None:
        body["coordination"] = coordination
    config.write_text(json.dumps(body))
    return config


async def test_fleet_status_shows_each_slot_held_the_budget_and_the_hosts(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        section = {"store": "redis", "url": server.url, "max_concurrent_restarts": 2, "restarts_per_hour": 6,
                   "lease_ttl": "60s"}  # fmt: skip
        config = write(tmp_path, section)
        ours = CoordinationConfig.model_validate({**section, "host": "gpu-7"})
        gate = FleetGate(open_coordinator(ours), ours)
        try:
            await gate.beat()  # registered
            slot = await gate.take(RESTARTS, "shrink", "k 4 -> 2: acceptance_critical firing")
            assert isinstance(slot, Slot), slot
            code, out, err = await specguard("fleet", "status", "--config", str(config))
            assert code == 0, err
            lines = out.splitlines()
            assert lines[0] == f"fleet: redis {server.url}, prefix specguard/: 1 host(s) registered"
            assert lines[1] == (
                "restarts: 1 of 2 slot(s) held (max_concurrent_restarts: 2); budget: 1 of 6 restarts in the last 1h"
            )
            assert lines[2].split() == ["HOLDER", "TOKEN", "SINCE", "HELD", "FOR", "LEASE", "LEFT", "FOR"]
            assert lines[3].startswith(f"gpu-7:shrink  {slot.token}  ") and lines[3].endswith(
                "k 4 -> 2: acceptance_critical firing"
            ), lines[3]
            assert lines[-1] == "hosts: gpu-7"
            code, out, err = await specguard("fleet", "status", "--config", str(config), "--json")
            assert code == 0, err
            shown = json.loads(out)
            (restarts,) = shown["semaphores"]
            (held,) = restarts["holders"]
            assert (held["owner"], held["token"], restarts["limit"]) == ("gpu-7:shrink", slot.token, 2)
            assert 50 < held["lease_left"] <= 60 and restarts["budget"] == {
                "used": 1,
                "limit": 6,
                "window": "1h",
            }
            assert shown["hosts"] == ["gpu-7"]
        finally:
            await gate.coordinator.close()


async def test_fleet_status_says_why_it_cannot_tell(tmp_path: Path) -> None:
    config = write(tmp_path, {"store": "redis", "url": f"redis://127.0.0.1:{free_port()}/0", "timeout": "1s"})
    code, out, err = await specguard("fleet", "status", "--config", str(config))
    assert (code, out) == (1, "")
    assert (
        err.startswith("specguard fleet: the fleet's redis at redis://127.0.0.1:")
        and "cannot be reached" in err
    )

    alone = write(tmp_path, None)
    code, out, err = await specguard("fleet", "status", "--config", str(alone))
    assert (code, err.strip()) == (
        2,
        f"specguard fleet: {alone} has no coordination: section: this host acts alone",
    )

    (tmp_path / "c.yaml").write_text(
        "coordination:\n  store: redis\n  url: redis://127.0.0.1:6379/0\n  password: {file: missing-password}\n"
    )
    code, out, err = await specguard("check", "--config", str(tmp_path / "c.yaml"))
    assert code == 1 and f"{tmp_path / 'c.yaml'}:4: coordination.password: " in err + out, err + out
    assert "missing-password" in err + out and "cannot read it" in err + out

    (tmp_path / "d.yaml").write_text(
        "coordination:\n  store: redis\n  url: redis://:hunter2@127.0.0.1:6379/0\n"
    )
    code, out, err = await specguard("fleet", "status", "--config", str(tmp_path / "d.yaml"))
    assert code == 2 and "no password in the URL" in err and "hunter2" not in err, err
