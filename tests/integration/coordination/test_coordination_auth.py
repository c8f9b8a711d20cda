"""A store that wants a password: Redis's AUTH (``--requirepass``), etcd's users (auth enabled).
The password comes from the section's secret reference; a wrong one is Unavailable, and the
message never carries it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd3gw.client import Etcd3Client

from specguard.coordination.base import RESTARTS, Unavailable
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.opening import open_coordinator
from tests.fleetstores import EtcdServer, redis_server
from tests.fleetstores import etcd_server as new_etcd

pytestmark = pytest.mark.real

PASSWORD = "s3cret-Pa55word"
WRONG = "not-the-Pa55word"


def config(
    store: str, url: str, directory: Path, password: str | None, user: str | None = None
) -> CoordinationConfig:
    raw: dict[str, object] = {"store": store, "url": url, "prefix": "auth/", "timeout": 2}
    if password is not None:
        (directory / "password").write_text(password + "\n")
        raw["password"] = {"file": "password"}
    if user is not None:
        raw["user"] = user
    return CoordinationConfig.model_validate(raw, context={"base": directory})


@pytest.fixture(scope="module")
def etcd_with_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """An etcd with authentication enabled: user root (all rights) has PASSWORD."""
    with new_etcd(tmp_path_factory.mktemp("etcd-auth")) as server:
        client = Etcd3Client(host="127.0.0.1", port=server.port, timeout=5, api_path="/v3/")
        for path, body in (
            ("/auth/user/add", {"name": "root", "password": PASSWORD}),
            ("/auth/role/add", {"name": "root"}),
            ("/auth/user/grant", {"user": "root", "role": "root"}),
            ("/auth/enable", {}),
        ):
            client.post(client.get_url(path), json=body)
        client.session.close()
        yield server


async def test_redis_with_its_password(tmp_path: Path) -> None:
    with redis_server(tmp_path, extra=["--requirepass", PASSWORD]) as server:
        right = open_coordinator(config("redis", server.url, tmp_path, PASSWORD))
        try:
            assert (await right.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")).granted
        finally:
            await right.close()
        for password in (WRONG, None):
            wrong = open_coordinator(config("redis", server.url, tmp_path, password))
            try:
                with pytest.raises(Unavailable) as raised:
                    await wrong.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")
            finally:
                await wrong.close()
            message = str(raised.value)
            assert message.startswith(f"redis at 127.0.0.1:{server.port}: acquire: ")
            assert PASSWORD not in message and WRONG not in message


async def test_etcd_with_a_user_and_password(etcd_with_users: EtcdServer, tmp_path: Path) -> None:
    right = open_coordinator(config("etcd", etcd_with_users.url, tmp_path, PASSWORD, user="root"))
    try:
        a = await right.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")
        assert a.token is not None
        assert await right.holds(RESTARTS, "a:vllm_restart", a.token)
        assert await right.release(RESTARTS, "a:vllm_restart", a.token)
    finally:
        await right.close()
    wrong = open_coordinator(config("etcd", etcd_with_users.url, tmp_path, WRONG, user="root"))
    try:
        with pytest.raises(Unavailable) as raised:
            await wrong.acquire(RESTARTS, "a:vllm_restart", 1, 30, "")
    finally:
        await wrong.close()
    message = str(raised.value)
    assert message == (
        f"etcd at 127.0.0.1:{etcd_with_users.port}: acquire: "
        "etcdserver: authentication failed, invalid user ID or password"
    )


async def test_etcd_authenticates_again_when_its_token_is_no_longer_valid(
    etcd_with_users: EtcdServer, tmp_path: Path
) -> None:
    c = open_coordinator(config("etcd", etcd_with_users.url, tmp_path, PASSWORD, user="root"))
    try:
        await c.register("web-1", 30)
        # What etcd answers once a token has expired (simple tokens last 5 minutes idle).
        c._client.session.headers["Authorization"] = "expired.1"  # type: ignore[attr-defined]
        await c.register("web-2", 30)
        assert await c.hosts() == ("web-1", "web-2")
    finally:
        await c.close()


async def test_etcd_without_credentials_is_refused(etcd_with_users: EtcdServer, tmp_path: Path) -> None:
    c = open_coordinator(config("etcd", etcd_with_users.url, tmp_path, None))
    try:
        with pytest.raises(Unavailable, match="user name is empty"):
            await c.hosts()
    finally:
        await c.close()
