"""Opening a Coordinator from the section: the client imported only for the store named, a clear
error without it, the password read from its reference (never shown), a store that is not there
answering Unavailable at once; and how refusals are worded."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from specguard.coordination.base import RESTARTS, Budget, Holder, Unavailable, limit_of
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.opening import ClientMissing, open_coordinator
from specguard.coordination.reasons import full, over_budget
from tests.ports import free_port


def section(store: str, url: str, **more: object) -> CoordinationConfig:
    return CoordinationConfig.model_validate(
        {"store": store, "url": url, **more}, context={"base": Path.cwd()}
    )


@pytest.mark.parametrize(
    ("store", "url", "library", "client"),
    [
        ("redis", "redis://127.0.0.1:6379/0", "redis", "redis-py"),
        ("etcd", "http://127.0.0.1:2379", "etcd3gw", "etcd3gw"),
    ],
)
def test_a_missing_client_names_the_fleet_extra(
    monkeypatch: pytest.MonkeyPatch, store: str, url: str, library: str, client: str
) -> None:
    for name in [m for m in sys.modules if m == library or m.startswith(f"{library}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, library, None)  # `import` of it now fails, as when not installed
    for name in ("specguard.coordination.redis_store", "specguard.coordination.etcd_store"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ClientMissing) as raised:
        open_coordinator(section(store, url))
    assert str(raised.value) == (
        f"coordination.store: {store} needs the {client} client, which is not installed: "
        "pip install 'specguard[fleet]'"
    )


def test_only_the_configured_store_s_client_is_imported(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from specguard.coordination.config import CoordinationConfig\n"
        "from specguard.coordination.opening import open_coordinator\n"
        "open_coordinator(CoordinationConfig(store=sys.argv[1], url=sys.argv[2]))\n"
        "print(sorted(m for m in ('redis', 'etcd3gw') if m in sys.modules))\n"
    )
    for store, url, imported in (
        ("redis", "redis://127.0.0.1:6379/0", "['redis']"),
        ("etcd", "http://127.0.0.1:2379", "['etcd3gw']"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code, store, url], capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[3]), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.stdout.strip() == imported


def test_the_password_is_read_from_its_reference_and_a_missing_one_is_named(tmp_path: Path) -> None:
    missing = CoordinationConfig.model_validate(
        {"store": "redis", "url": "redis://127.0.0.1:6379/0", "password": {"file": "nothere"}},
        context={"base": tmp_path},
    )
    with pytest.raises(ValueError, match=r"^coordination\.password file .*nothere: cannot read it"):
        open_coordinator(missing)
    unset = section("redis", "redis://127.0.0.1:6379/0", password={"env": "SPECGUARD_TEST_UNSET_PASSWORD"})
    with pytest.raises(
        ValueError,
        match=r"^coordination\.password: environment variable SPECGUARD_TEST_UNSET_PASSWORD is not set$",
    ):
        open_coordinator(unset)


def test_etcd_wants_a_user_with_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGUARD_TEST_PASSWORD", "pw")
    for more in ({"password": {"env": "SPECGUARD_TEST_PASSWORD"}}, {"user": "root"}):
        with pytest.raises(ValueError, match=r"etcd's authentication needs both `user` and `password`"):
            open_coordinator(section("etcd", "http://127.0.0.1:2379", **more))


@pytest.mark.parametrize(
    ("store", "scheme"), [("redis", "redis://127.0.0.1:{}/0"), ("etcd", "http://127.0.0.1:{}")]
)
async def test_nothing_listening_is_unavailable_at_once(store: str, scheme: str) -> None:
    port = free_port()
    c = open_coordinator(section(store, scheme.format(port), timeout=3))
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable) as raised:
            await c.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")
        assert time.monotonic() - started < 2.5  # refused: no waiting for the timeout
        assert str(raised.value).startswith(f"{store} at 127.0.0.1:{port}: acquire: ")
    finally:
        await c.close()


def test_refusals_name_the_holders_oldest_first_and_the_budget() -> None:
    holders = [
        Holder("b:vllm_restart", 9, 0.0, 30.0, "rule acceptance_collapse on b"),
        Holder("a:vllm_restart", 7, 0.0, 30.0),
    ]
    assert full(2, holders) == (
        "2 of 2 slots held by a:vllm_restart (token 7), "
        "b:vllm_restart (token 9, for: rule acceptance_collapse on b)"
    )
    assert over_budget(6, Budget(6, 3600)) == "budget: 6 of 6 in the last 1h"
    assert over_budget(3, Budget(3, 5400)) == "budget: 3 of 3 in the last 1h30m"


@pytest.mark.parametrize(
    ("spec", "hosts", "limit"),
    [
        (2, 10, 2),
        (0.25, 8, 2),
        (0.25, 10, 2),
        (0.25, 3, 1),
        (0.5, 1, 1),
        (1.0, 7, 7),
        (0.1, 0, 1),
        (0.3, 10, 3),
    ],
)
def test_a_share_is_of_the_registered_hosts_and_at_least_one(
    spec: int | float, hosts: int, limit: int
) -> None:
    assert limit_of(spec, hosts) == limit
