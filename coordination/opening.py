"""A Coordinator from the ``coordination:`` section: the store's client imported only here, when the
section names that store, so a host without the section (or without the ``fleet`` extra) never
imports redis-py or etcd3gw."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from specguard.common.secrets import read_if_given
from specguard.coordination.base import Coordinator
from specguard.coordination.config import CoordinationConfig

FLEET_EXTRA = "pip install 'specguard[fleet]'"


class ClientMissing(Exception):
    """The store's Python client is not installed."""


def open_coordinator(config: CoordinationConfig, clock: Callable[[], float] | None = None) -> Coordinator:
    """A Coordinator on the configured store. The connection is made at the first call (a store
    down now is an ``Unavailable`` then, not an error here). Raises ``ClientMissing`` without the
    client library, ValueError when the password cannot be read (naming where, never the value)."""
    password = read_if_given(config.password, "coordination.password")
    if config.store == "redis":
        return _redis(config, password, clock)
    return _etcd(config, password, clock)


def _missing(library: str, store: str) -> ClientMissing:
    return ClientMissing(
        f"coordination.store: {store} needs the {library} client, which is not installed: {FLEET_EXTRA}"
    )


def _redis(
    config: CoordinationConfig, password: str | None, clock: Callable[[], float] | None
) -> Coordinator:
    try:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        from specguard.coordination.redis_store import RedisCoordinator
    except ImportError:
        raise _missing("redis-py", "redis") from None
    parts = urlsplit(config.url)
    where = parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"
    client = Redis.from_url(
        config.url,
        username=config.user,
        password=password,
        decode_responses=True,
        socket_timeout=config.timeout,
        socket_connect_timeout=config.timeout,
        # One immediate retry: a pooled connection the server closed (it restarted) is replaced
        # at once; a server down answers Unavailable at once, not after a backoff.
        retry=Retry(NoBackoff(), 1),
    )
    return RedisCoordinator(client, where, config.prefix, config.timeout, clock)


def _etcd(config: CoordinationConfig, password: str | None, clock: Callable[[], float] | None) -> Coordinator:
    try:
        from etcd3gw.client import Etcd3Client

        from specguard.coordination.etcd_store import EtcdCoordinator
    except ImportError:
        raise _missing("etcd3gw", "etcd") from None
    parts = urlsplit(config.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 2379
    # /v3/ given, not discovered: checked against etcd 3.4.23, whose /version answers 3.4 and whose
    # gateway serves /v3/ (discovery would cost one more request per client).
    client = Etcd3Client(host=host, port=port, protocol=parts.scheme, timeout=config.timeout, api_path="/v3/")
    if (config.user is None) != (password is None):
        raise ValueError("coordination: etcd's authentication needs both `user` and `password`")
    return EtcdCoordinator(
        client, f"{host}:{port}", config.prefix, config.timeout, clock, config.user, password
    )
