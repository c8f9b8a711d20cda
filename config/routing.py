"""``routing:``: the traffic classes an nginx router in front of vLLM sends to a speculative or a
standard pool, and the flag that sends everything to the standard pool (the fallback).

Each class is a name, a pool and conditions on the request (``when``), all of which must hold;
the first class that matches wins, a request matching none goes to ``default_pool``. The fields a
condition may test are the request's ``path`` and, from its JSON body, ``temperature``, ``top_p``,
``max_tokens`` (``max_completion_tokens`` where given), ``stream``, ``n``, ``model`` and
``prompt_chars`` (the prompt's length in characters). ``specguard routing render`` writes the nginx
configuration and its Lua from this section; ``playbook.routing.classify`` evaluates the same
classes in Python.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from specguard.common.addresses import is_loopback
from specguard.common.paths import ConfigPath
from specguard.common.sizes import parse_size

PATHS = ("/v1/completions", "/v1/chat/completions")
NUMBER_FIELDS = ("temperature", "top_p", "max_tokens", "n", "prompt_chars")
STRING_FIELDS = ("model", "path")
BOOL_FIELDS = ("stream",)
FIELDS = (*NUMBER_FIELDS, *STRING_FIELDS, *BOOL_FIELDS)
# Classes the router names itself: no class matched, a body it could not read, a path not inspected.
DEFAULT_CLASS, MALFORMED_CLASS, OTHER_CLASS = "default", "malformed", "other"
RESERVED_CLASSES = (DEFAULT_CLASS, MALFORMED_CLASS, OTHER_CLASS)
ORDER_OPS = ("lt", "le", "gt", "ge")
OPS = (*ORDER_OPS, "eq", "ne", "in", "not_in")
MAX_BODY_LIMIT = 64 * 2**20

_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")
_CLASS = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_HOST_PORT = re.compile(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})")


def _body_size(value: Any) -> int:
    return parse_size(value, 1024, MAX_BODY_LIMIT)


BodySize = Annotated[int, BeforeValidator(_body_size)]


def split_host_port(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``; ValueError saying what is expected."""
    match = _HOST_PORT.fullmatch(value.strip()) if isinstance(value, str) else None
    port = int(match.group("port")) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:8080, [::1]:8080)")
    return match.group("v6") or match.group("host"), port


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pool(_Strict):
    """One upstream group: vLLM servers that serve the same model the same way."""

    servers: tuple[str, ...] = Field(min_length=1)  # host:port of each vLLM server
    keepalive: int = Field(32, ge=0, le=4096)  # idle connections kept open to the pool, per worker

    @field_validator("servers")
    @classmethod
    def _servers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for server in value:
            split_host_port(server)
        if len(set(value)) != len(value):
            raise ValueError("a server is listed twice")
        return value


def _check_value(field: str, op: str, value: Any) -> None:
    """A condition's value, of the type its field takes; ValueError saying what was expected."""
    if op in ("in", "not_in"):
        if not isinstance(value, list) or not value:
            raise ValueError(f"`{op}` takes a non-empty list of values")
        for item in value:
            _check_value(field, "eq", item)
        return
    if field in BOOL_FIELDS:
        if op not in ("eq", "ne") or not isinstance(value, bool):
            raise ValueError(f"{field} is true or false: give `{field}: true` or `{field}: {{ne: true}}`")
    elif field in STRING_FIELDS:
        if op in ORDER_OPS or not isinstance(value, str):
            raise ValueError(f"{field} is compared as a string with eq, ne, in or not_in")
        if field == "path" and value not in PATHS:
            raise ValueError(f"path is one of {', '.join(PATHS)}, not {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"{field} is a number, not {value!r}")


class Condition(_Strict):
    """``field: value`` (equal), or ``field: {op: value, ...}`` with op in lt, le, gt, ge, eq, ne,
    in, not_in; every op given must hold."""

    field: str
    ops: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        return " and ".join(f"{self.field} {op} {value!r}" for op, value in self.ops)


def _conditions(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        raise ValueError(f"`when` maps fields ({', '.join(FIELDS)}) to values or {{op: value}}")
    conditions = []
    for field, spec in value.items():
        if field not in FIELDS:
            raise ValueError(f"unknown field {field!r}: one of {', '.join(FIELDS)}")
        ops = list(spec.items()) if isinstance(spec, dict) else [("eq", spec)]
        if not ops:
            raise ValueError(f"{field}: give a value or at least one of {', '.join(OPS)}")
        for op, item in ops:
            if op not in OPS:
                raise ValueError(f"{field}: unknown operator {op!r}: one of {', '.join(OPS)}")
            try:
                _check_value(field, op, item)
            except ValueError as exc:
                raise ValueError(
                    f"{field}.{op}: {exc}" if isinstance(spec, dict) else f"{field}: {exc}"
                ) from None
        conditions.append(Condition(field=field, ops=tuple((op, item) for op, item in ops)))
    return tuple(conditions)


class TrafficClass(_Strict):
    name: str
    pool: str
    when: Annotated[tuple[Condition, ...], BeforeValidator(_conditions)]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _CLASS.fullmatch(value):
            raise ValueError("a class name is a letter then letters, digits, `_`, `.` or `-` (64 at most)")
        if value in RESERVED_CLASSES:
            raise ValueError(f"{value!r} is the router's own class name; pick another")
        return value

    def fields(self) -> tuple[str, ...]:
        return tuple(c.field for c in self.when)


class RoutingConfig(_Strict):
    listen: str = "127.0.0.1:8080"  # where clients send their requests
    admin_listen: str = "127.0.0.1:8081"  # the flag and the router's metrics: loopback only
    flag_file: ConfigPath  # {"fallback": true|false}; read by nginx when it starts
    pools: dict[str, Pool] = Field(min_length=1)
    default_pool: str
    fallback_pool: str
    classes: tuple[TrafficClass, ...] = ()
    # nginx keeps a body up to ``body_buffer_size`` in memory; a larger one (up to max_body_size)
    # goes to a temporary file, which the router then reads. Equal by default: nothing spills.
    max_body_size: BodySize = 2**20
    body_buffer_size: BodySize | None = None
    access_log: ConfigPath | None = None  # default: /var/log/nginx/specguard-routing.log
    read_timeout: float = Field(600.0, gt=0, le=86400)  # the longest silence within a response

    @field_validator("listen", "admin_listen")
    @classmethod
    def _address(cls, value: str) -> str:
        split_host_port(value)
        return value

    @field_validator("admin_listen")
    @classmethod
    def _loopback(cls, value: str) -> str:
        if not is_loopback(split_host_port(value)[0]):
            raise ValueError(f"{value!r}: the admin location sets the flag; it listens on loopback only")
        return value

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, value: dict[str, Pool]) -> dict[str, Pool]:
        for name in value:
            if not _NAME.fullmatch(name):
                raise ValueError(f"pool name {name!r}: lower-case letters, digits and `_`, a letter first")
        return value

    @model_validator(mode="after")
    def _refs(self) -> RoutingConfig:
        known = ", ".join(self.pools)
        for where, pool in (("default_pool", self.default_pool), ("fallback_pool", self.fallback_pool)):
            if pool not in self.pools:
                raise ValueError(f"{where}: no pool {pool!r} (pools: {known})")
        names: set[str] = set()
        for index, item in enumerate(self.classes):
            if item.pool not in self.pools:
                raise ValueError(f"classes[{index}] ({item.name}): no pool {item.pool!r} (pools: {known})")
            if item.name in names:
                raise ValueError(f"classes[{index}]: the class name {item.name!r} is used twice")
            names.add(item.name)
        if self.body_buffer_size is not None and self.body_buffer_size > self.max_body_size:
            raise ValueError("body_buffer_size is larger than max_body_size: make it equal or smaller")
        if split_host_port(self.listen) == split_host_port(self.admin_listen):
            raise ValueError("listen and admin_listen are the same address")
        return self

    @property
    def buffer_size(self) -> int:
        return self.body_buffer_size if self.body_buffer_size is not None else self.max_body_size

    def fields(self) -> tuple[str, ...]:
        """Every field some class tests, in the order first named."""
        seen: dict[str, None] = {}
        for item in self.classes:
            seen.update(dict.fromkeys(item.fields()))
        return tuple(seen)
