"""The store stopped, hung (SIGSTOP) or started again: every call answers Unavailable within the
timeout, never a grant, and the same Coordinator works again once the store is back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from specguard.coordination.base import RESTARTS, Coordinator, Unavailable
from tests.fleetstores import EtcdServer, RedisServer, etcd_server, redis_server
from tests.integration.coordination.conftest import FakeClock, new_prefix, open_on

pytestmark = pytest.mark.real

TIMEOUT = 1.0
SLACK = 1.0  # a loaded machine's scheduling, on top of the timeout


@pytest.fixture(params=["etcd", "redis"])
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EtcdServer | RedisServer]:
    """A store of this test's own: the test stops it."""
    server = etcd_server(tmp_path) if request.param == "etcd" else redis_server(tmp_path)
    with server:
        yield server


def calls(c: Coordinator) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "acquire": lambda: c.acquire(RESTARTS, "b:vllm_restart", 2, 30, ""),
        "renew": lambda: c.renew(RESTARTS, "a:vllm_restart", 1, 30),
        "release": lambda: c.release(RESTARTS, "a:vllm_restart", 1),
        "holds": lambda: c.holds(RESTARTS, "a:vllm_restart", 1),
        "holders": lambda: c.holders(RESTARTS),
        "budget_used": lambda: c.budget_used(RESTARTS, 3600),
        "register": lambda: c.register("web-1", 30),
        "hosts": lambda: c.hosts(),
    }


async def assert_unavailable(c: Coordinator, store: str) -> None:
    """Every call, all at once: each raises Unavailable, all within the timeout."""
    started = time.monotonic()
    answers = await asyncio.gather(*(call() for call in calls(c).values()), return_exceptions=True)
    took = time.monotonic() - started
    assert took < TIMEOUT + SLACK, f"the calls took {took:.2f}s"
    for name, answer in zip(calls(c), answers, strict=True):
        assert isinstance(answer, Unavailable), f"{name}: {answer!r}"
        assert str(answer).startswith(f"{store} at 127.0.0.1:"), str(answer)


async def test_a_stopped_store_is_unavailable_at_once_and_works_when_back(
    own_server: EtcdServer | RedisServer, request: pytest.FixtureRequest
) -> None:
    store = own_server.name
    clock = FakeClock()
    c = open_on(own_server, new_prefix(request.node.name), clock, timeout=TIMEOUT)
    try:
        a = await c.acquire(RESTARTS, "a:vllm_restart", 2, 30, "")
        assert a.token is not None
        own_server.stop()
        await assert_unavailable(c, store)

        own_server.start()  # same port and directory
        clock.advance(1)  # Redis's time goes on while it is down (its token counter starts from it)
        b = await c.acquire(RESTARTS, "b:vllm_restart", 2, 30, "")
        assert b.token is not None and b.token > a.token
        if store == "etcd":  # its data survived: a's slot and lease too
            assert await c.holds(RESTARTS, "a:vllm_restart", a.token)
            assert [h.owner for h in await c.holders(RESTARTS)] == ["a:vllm_restart", "b:vllm_restart"]
        else:  # started empty: a's slot is gone, and a learns it
            assert not await c.holds(RESTARTS, "a:vllm_restart", a.token)
            assert [h.owner for h in await c.holders(RESTARTS)] == ["b:vllm_restart"]
    finally:
        await c.close()


async def test_a_hung_store_is_unavailable_within_the_timeout_and_works_when_resumed(
    own_server: EtcdServer | RedisServer, request: pytest.FixtureRequest
) -> None:
    store = own_server.name
    c = open_on(own_server, new_prefix(request.node.name), FakeClock(), timeout=TIMEOUT)
    try:
        a = await c.acquire(RESTARTS, "a:vllm_restart", 2, 30, "")
        assert a.token is not None
        own_server.pause()
        try:
            await assert_unavailable(c, store)
        finally:
            own_server.resume()
        # Calls cut off by the timeout may still have been carried out once the store woke up
        # (b's acquire among them): b asking again gets that slot back, or a new one.
        b = await c.acquire(RESTARTS, "b:vllm_restart", 2, 30, "")
        assert b.token is not None and b.token > a.token
        assert await c.holds(RESTARTS, "a:vllm_restart", a.token)
        assert len(await c.holders(RESTARTS)) == 2
    finally:
        await c.close()


async def test_a_store_down_when_opened_is_used_once_it_is_up(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    for server in (redis_server(tmp_path / "redis"), etcd_server(tmp_path / "etcd")):
        c = open_on(server, new_prefix(request.node.name), FakeClock(), timeout=TIMEOUT)
        try:
            with pytest.raises(Unavailable):
                await c.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")
            with server:
                assert (await c.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")).granted
        finally:
            await c.close()
