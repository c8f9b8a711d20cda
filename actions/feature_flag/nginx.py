"""``nginx:``: the flag of specguard's own router (``specguard routing render``), set through its
loopback admin location and kept in its flag file.

A change writes the flag file first (atomically, the previous version kept as ``PATH.prev``), then
PUTs the same value to ``<admin_url>/specguard/flag``: the router follows what the admin location
holds (a ``lua_shared_dict``, kept across ``nginx -s reload``), and reads the file when nginx
starts, so a restart keeps what the admin location was told. Read back, the flag is what both
say: ``engaged`` or ``restored`` when they agree, ``unknown`` when they do not (someone set one of
them by hand, or a change was cut short between the two): the controller then writes both again
rather than trust either.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, field_validator
from yarl import URL

from specguard.actions.feature_flag.answers import QUOTE, AnswerError, fetch
from specguard.actions.feature_flag.backends import BackendError
from specguard.common.files import read_or_none, write_atomically
from specguard.common.http import MAX_RESPONSE_SIZE
from specguard.common.paths import ConfigPath
from specguard.rules.durations import Duration

FLAG_PATH = "/specguard/flag"
MAX_BACKOFF = 30.0  # the most a retry waits, as for the http backend
FILE_WRITE = 1.0  # what the file's write is allowed in the longest change


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NginxParams(BaseModel):
    """``nginx:``: the router's admin location and its flag file (the ``routing:`` section's
    ``admin_listen`` and ``flag_file``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    admin_url: str  # http://127.0.0.1:8081: the router's admin_listen, loopback only
    flag_file: ConfigPath  # {"fallback": true|false}: what nginx reads when it starts
    request_timeout: Duration = Field(10.0, gt=0)
    retries: int = Field(3, ge=0, le=10)  # after the first attempt
    backoff: Duration = Field(1.0, gt=0)  # before the first retry; doubled for each next one

    @field_validator("admin_url")
    @classmethod
    def _admin_url(cls, value: str) -> str:
        try:
            url = URL(value)
        except ValueError:
            url = None
        if url is None or url.scheme != "http" or not url.host or not url.is_absolute():
            raise ValueError(
                f"{value!r}: give the router's admin_listen as http://HOST:PORT (e.g. http://127.0.0.1:8081)"
            )
        if url.path not in ("", "/") or url.query_string or url.fragment or url.user:
            raise ValueError(f"{value!r}: give http://HOST:PORT only; specguard adds {FLAG_PATH}")
        if not is_loopback(url.host):
            raise ValueError(
                f"{value!r}: the router's admin location listens on loopback only "
                "(127.0.0.1, ::1 or localhost): run specguard on the router's host"
            )
        return value.rstrip("/")

    @property
    def flag_url(self) -> str:
        return self.admin_url + FLAG_PATH

    def hostport(self) -> tuple[str, int]:
        url = URL(self.admin_url)
        assert url.host is not None and url.port is not None
        return url.host, url.port

    def longest_write(self) -> float:
        """The most one change may take: the file, then every PUT waiting its whole
        ``request_timeout``, and the waits between them."""
        waits = sum(min(MAX_BACKOFF, self.backoff * 2**attempt) for attempt in range(self.retries))
        return float(FILE_WRITE + (self.retries + 1) * self.request_timeout + waits)


def file_text(engaged: bool) -> str:
    return json.dumps({"fallback": engaged}, indent=2) + "\n"


def file_says(text: str | None) -> bool:
    """Whether nginx, starting now, would read the fallback engaged from this file's text: only a
    JSON object whose ``fallback`` is ``true`` (a missing or unreadable file: not engaged)."""
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("fallback") is True


def _said(body: Any) -> bool | None:
    """The admin location's answer: its ``fallback`` (true or false), or None."""
    if isinstance(body, dict) and isinstance(body.get("fallback"), bool):
        return bool(body["fallback"])
    return None


class NginxBackend:
    """Retries connection failures, timeouts and 5xx with doubling waits; a 4xx (a body the router
    refused) fails at once with its reason. A 200 whose body does not say the value sent is tried
    again like a 5xx: the router did not take it."""

    confirms = True  # what both read back is what the router follows now and after a restart

    def __init__(self, params: NginxParams, limit: int = MAX_RESPONSE_SIZE) -> None:
        self.params = params
        self.limit = limit

    def _wait(self, attempt: int) -> float:
        return float(min(MAX_BACKOFF, self.params.backoff * 2 ** (attempt - 1)))

    async def set(self, value: Any, what: str) -> str:
        engage = bool(value["fallback"])
        done = await asyncio.to_thread(self._write_file, engage, what)
        return f"{done}; {await self._put(engage, what)}"

    def _write_file(self, engage: bool, what: str) -> str:
        path, text = self.params.flag_file, file_text(engage)
        try:
            if read_or_none(path) == text:
                return f"{path} already says so"
            write_atomically(path, text)
            if read_or_none(path) != text:
                raise BackendError(f"{what}: {path} does not read back as written")
        except OSError as exc:
            raise BackendError(f"{what}: cannot write {path}: {exc.strerror or exc}") from None
        return f"wrote {path}"

    async def _put(self, engage: bool, what: str) -> str:
        p = self.params
        timeout = aiohttp.ClientTimeout(total=p.request_timeout)
        last = ""
        for attempt in range(p.retries + 1):
            if attempt:
                await asyncio.sleep(self._wait(attempt))
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    answer = await fetch(
                        session, "PUT", p.flag_url, limit=self.limit, json={"fallback": engage}
                    )
                    body = answer.json() if answer.status == 200 else None
            except AnswerError as exc:
                last = str(exc)
                if not exc.retry and exc.status is not None and exc.status < 500:
                    raise BackendError(f"{what}: {exc}") from None
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"[:QUOTE] if str(exc) else type(exc).__name__
                continue
            if answer.status == 200 and _said(body) is engage:
                return f"PUT {p.flag_url}: 200" + (f" after {attempt} retries" if attempt else "")
            if answer.status == 200:
                last = f"200 saying {answer.quote()!r}, not fallback {str(engage).lower()}"
                continue
            last = f"{answer.status} {answer.quote()}".strip()
            if answer.status not in (408, 429) and answer.status < 500:
                raise BackendError(f"{what}: PUT {p.flag_url} answered {last}")
        tries = p.retries + 1
        times = "once" if tries == 1 else f"{tries} times"
        raise BackendError(f"{what}: PUT {p.flag_url} failed {times}, last: {last}")

    async def read(self, engage: Any = None, restore: Any = None) -> str | None:
        """``engaged`` or ``restored`` when the admin location and the flag file agree; ``unknown``
        when they do not; None when the admin location cannot be read (nginx down: nothing to
        confirm, nothing routed either)."""
        p = self.params
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=p.request_timeout)
            ) as session:
                answer = await fetch(session, "GET", p.flag_url, limit=self.limit)
            router = _said(answer.json()) if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, AnswerError):
            return None
        if router is None:
            return None
        try:
            text = await asyncio.to_thread(read_or_none, p.flag_file)
        except OSError:
            return "unknown"  # a file nginx cannot read either: written again
        if file_says(text) != router:
            return "unknown"
        return "engaged" if router else "restored"
