"""The ``coordination:`` section: the fleet's store, and the bounds on disruption it keeps.

Without the section a host acts alone, as before. With it, a vLLM restart takes a slot of the
fleet's ``restarts`` semaphore first (at most ``max_concurrent_restarts`` at once, at most
``restarts_per_hour`` started fleet-wide in any hour), and, with ``max_in_fallback``, engaging the
fallback flag takes a slot of the ``fallback`` semaphore.
"""

from __future__ import annotations

import re
import socket
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from specguard.common.secrets import SecretRef
from specguard.rules.durations import Duration

SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def _limit(value: object) -> object:
    """A number of hosts (2), or a share of the fleet's registered hosts ("25%")."""
    if isinstance(value, str):
        m = SHARE.match(value)
        if m is None:
            raise ValueError(f"{value!r} is neither a number of hosts (2) nor a share of the fleet (25%)")
        share = float(m.group(1)) / 100
        if not 0 < share <= 1:
            raise ValueError(f"{value!r}: a share is over 0% and at most 100%")
        return share
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r}: a number of hosts is a whole number, at least 1 (or a share: 25%)")
    return value


# int: that many hosts; float: that share of the registered hosts (at least one).
Limit = Annotated[int | float, BeforeValidator(_limit)]


class CoordinationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    store: Literal["etcd", "redis"]
    # etcd: its client URL (http://127.0.0.1:2379); redis: redis://HOST:PORT/DB (rediss:// for TLS)
    url: str
    password: SecretRef | None = None  # Redis AUTH (or etcd's user's, with `user`)
    user: str | None = None
    prefix: str = "specguard/"  # every key under it: one fleet per prefix
    host: str = Field(default_factory=socket.gethostname)  # this host's name in the fleet
    lease_ttl: Duration = Field(30.0, ge=2)  # a crashed holder's slot frees at most this long after
    max_concurrent_restarts: Limit = 1
    restarts_per_hour: int | None = Field(None, ge=1)  # fleet-wide; none: no budget
    max_in_fallback: Limit | None = None  # none: the flag takes no slot
    retry: Duration = Field(15.0, gt=0)  # a restart deferred for want of a slot tries again after
    timeout: Duration = Field(5.0, gt=0)  # for one call to the store

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value or any(ch.isspace() for ch in value):
            raise ValueError("a prefix is a non-empty key prefix without spaces, like specguard/")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value or len(value) > 200 or any(ch.isspace() or ch == ":" for ch in value):
            raise ValueError("a host name is 1-200 characters, without spaces or ':'")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str, info: ValidationInfo) -> str:
        try:
            parts = urlsplit(value)
            password = parts.password
        except ValueError:  # (a port that is not a number)
            raise ValueError("not a URL like redis://127.0.0.1:6379/0 or http://127.0.0.1:2379") from None
        # First, and without repeating the URL: a password there must not reach a log.
        if password:
            raise ValueError("no password in the URL; give `password: {file: ...}` or {env: ...}")
        store = info.data.get("store")  # (declared first: already checked, if given)
        if store not in ("etcd", "redis"):
            return value
        schemes = ("http", "https") if store == "etcd" else ("redis", "rediss", "unix")
        example = "http://127.0.0.1:2379" if store == "etcd" else "redis://127.0.0.1:6379/0"
        if parts.scheme not in schemes or (parts.scheme != "unix" and not parts.hostname):
            raise ValueError(f"{value!r} is not an {store} URL like {example}" if store == "etcd"
                             else f"{value!r} is not a {store} URL like {example}")  # fmt: skip
        return value
