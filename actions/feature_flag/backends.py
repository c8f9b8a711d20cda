"""Where a feature flag lives: an HTTP API (a router's, a flag service's) or a file that a router
or service reads. Each backend sets the flag to its ``engage`` or ``restore`` value and says how it
went; the action around it decides when."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import aiohttp
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specguard.actions.feature_flag.answers import QUOTE, AnswerError, FollowRedirects, fetch
from specguard.common.commands import CommandError, run_command
from specguard.common.files import read_or_none, write_atomically, write_target
from specguard.common.http import MAX_RESPONSE_SIZE, retry_after
from specguard.common.paths import ConfigPath
from specguard.common.secrets import SecretRef
from specguard.rules.durations import Duration, format_wait

# The most a retry waits, however many came before it.
MAX_BACKOFF = 30.0
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BackendError(Exception):
    """The flag could not be set; the message says what was tried and what came back.
    ``retry_after``: how long the flag API asked to be left alone (Retry-After), already capped."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Backend(Protocol):
    # Whether a value read back is what the router follows: a change whose outcome is unknown is
    # then confirmed by reading it, rather than written again.
    confirms: bool

    async def set(self, value: Any, what: str) -> str:
        """Set the flag to ``value`` (``what``: engage | restore); returns what was done. Raises
        BackendError."""
        ...

    async def read(self, engage: Any, restore: Any) -> str | None:
        """What the flag says now, read from the world: ``engaged`` or ``restored`` (it holds
        ``engage``'s or ``restore``'s value), or None when it cannot be read or holds neither
        (no way to read configured, a missing file, a value someone else wrote). A backend of
        two places (the nginx router: its admin location and its flag file) answers ``unknown``
        when they disagree: what was confirmed no longer holds, and the change is made again."""
        ...


def matches(found: Any, value: Any) -> bool:
    """Whether a value read back holds ``value``: equal, or for a mapping, every key of
    ``value`` present with an equal value (a flag API may answer more fields than it was sent)."""
    if isinstance(value, Mapping) and isinstance(found, Mapping):
        return all(key in found and matches(found[key], item) for key, item in value.items())
    return bool(found == value)


def which(found: Any, engage: Any, restore: Any) -> str | None:
    engaged, restored = matches(found, engage), matches(found, restore)
    if engaged == restored:
        return None
    return "engaged" if engaged else "restored"


# --- http -------------------------------------------------------------------------------------


class HttpParams(BaseModel):
    """``http:``: one request per change, e.g. ``PUT /flags/speculative`` with a JSON body."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    method: Literal["POST", "PUT", "PATCH", "DELETE"] = "PUT"
    headers: dict[str, str] = Field(default_factory=dict)
    engage: Any = None  # the JSON body that engages the fallback (None: no body)
    restore: Any = None  # the JSON body that restores speculative decoding
    expect_status: tuple[int, ...] = (200, 201, 202, 204)
    request_timeout: Duration = Field(10.0, gt=0)
    retries: int = Field(3, ge=0, le=10)  # after the first attempt
    backoff: Duration = Field(1.0, gt=0)  # before the first retry; doubled for each next one
    token: SecretRef | None = None  # sent as "Authorization: Bearer <token>"
    # A GET that answers the flag's value as JSON (the same URL, usually): specguard reads the flag
    # back from it, at most every ``read_every``, and puts it right when it differs from what the
    # rules want (someone restored it by hand while a rule fires). None: never read back.
    read_url: str | None = None
    read_every: Duration = Field(30.0, gt=0)

    @field_validator("url", "read_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"https?://[^/\s]+", value):
            raise ValueError("give an http:// or https:// URL")
        return value

    def longest_write(self) -> float:
        """The most one change may take: every try waiting its whole ``request_timeout``, and
        the waits between them."""
        waits = sum(min(MAX_BACKOFF, self.backoff * 2**attempt) for attempt in range(self.retries))
        return float((self.retries + 1) * self.request_timeout + waits)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() == "authorization":
                raise ValueError("give the token with `token:` (read from a file), not as a header")
        return value


class HttpBackend:
    """Retries connection failures, timeouts, 429 and 5xx with doubling waits; any other answer
    outside ``expect_status`` is a mistake no retry will fix, and fails at once. A 429 or 503 whose
    ``Retry-After`` asks for longer than the next retry would wait ends the tries: the failure says
    how long the API asked for (at most ``most_wait``), and the action waits that long."""

    confirms = True  # the flag service answers what it holds

    def __init__(
        self,
        params: HttpParams,
        token: str | None,
        limit: int = MAX_RESPONSE_SIZE,
        follow: FollowRedirects = "never",
        most_wait: float = 300.0,
    ) -> None:
        self.params = params
        self._token = token  # never logged, never put in an outcome
        self.limit = limit  # max_response_size
        self.follow = follow  # follow_redirects
        self.most_wait = most_wait  # the longest Retry-After honoured: the action's retry_max_backoff

    def _headers(self) -> dict[str, str]:
        headers = dict(self.params.headers)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _wait(self, attempt: int) -> float:
        """The wait before try ``attempt`` (1: the first retry)."""
        return float(min(MAX_BACKOFF, self.params.backoff * 2 ** (attempt - 1)))

    async def set(self, value: Any, what: str) -> str:
        p = self.params
        timeout = aiohttp.ClientTimeout(total=p.request_timeout)
        last = ""
        asked: float | None = None  # what the last answer's Retry-After asked for
        tries = 0
        for attempt in range(p.retries + 1):
            if attempt:
                await asyncio.sleep(self._wait(attempt))
            tries += 1
            asked = None
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    answer = await fetch(
                        session, p.method, p.url, follow=self.follow, limit=self.limit, json=value,
                        headers=self._headers(),
                    )  # fmt: skip
            except AnswerError as exc:
                last = str(exc)
                if not exc.retry:
                    raise BackendError(f"{what}: {exc}") from None
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"[:QUOTE] if str(exc) else type(exc).__name__
                continue
            if answer.status in p.expect_status:
                return f"{answer.where}: {answer.status}" + (f" after {attempt} retries" if attempt else "")
            last = f"{answer.status} {answer.quote()}".strip()
            if answer.status not in (408, 429) and answer.status < 500:
                raise BackendError(f"{what}: {answer.where} answered {last}")
            if answer.url != answer.asked:
                last = f"{last}, answered by {answer.url}"
            if answer.status in (429, 503):
                asked = retry_after(answer.headers.get("Retry-After"), time.time(), self.most_wait)
                if asked is not None and attempt < p.retries and asked > self._wait(attempt + 1):
                    break  # the API asks for longer than the next try would wait: the action waits
        if asked is not None:
            last = f"{last}; it asked to be tried again in {format_wait(asked)} (Retry-After)"
        raise BackendError(f"{what}: {p.method} {p.url} failed {_times(tries)}, last: {last}", asked)

    async def read(self, engage: Any, restore: Any) -> str | None:
        p = self.params
        if p.read_url is None:
            return None
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=p.request_timeout)
            ) as session:
                answer = await fetch(
                    session, "GET", p.read_url, follow=self.follow, limit=self.limit, headers=self._headers()
                )
            if answer.status != 200:
                return None
            body = answer.json()
        except (aiohttp.ClientError, TimeoutError, AnswerError):
            return None
        return which(body, engage, restore)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


# --- file -------------------------------------------------------------------------------------


class FileParams(BaseModel):
    """``file:``: the whole file written with the ``engage`` or ``restore`` mapping, atomically,
    the previous version kept beside it (``PATH.prev``), then ``reload`` run if given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: ConfigPath
    format: Literal["json", "yaml", "env"] | None = None  # None: from the file's suffix
    engage: dict[str, Any]
    restore: dict[str, Any]
    reload: tuple[str, ...] | None = None  # an argument list, run without a shell
    reload_timeout: Duration = Field(30.0, gt=0)

    def longest_write(self) -> float:
        """The most one change may take: the reload command's timeout, and a second for the file."""
        return 1.0 + (self.reload_timeout if self.reload is not None else 0.0)

    @field_validator("reload", mode="before")
    @classmethod
    def _reload(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                "give the command as a list of arguments, e.g. [systemctl, reload, router]; "
                "it is run without a shell"
            )
        if value is not None and not value:
            raise ValueError("an empty command: give its arguments, or leave `reload` out")
        return value

    @model_validator(mode="after")
    def _format(self) -> FileParams:
        kind = self.kind
        if kind == "env":
            for mapping in (self.engage, self.restore):
                for key, item in mapping.items():
                    if not _ENV_KEY.fullmatch(key):
                        raise ValueError(f"{key!r} is not a variable name an env file can hold")
                    if isinstance(item, dict | list):
                        raise ValueError(f"{key}: an env file holds plain values, not lists or mappings")
        return self

    @property
    def kind(self) -> str:
        if self.format is not None:
            return self.format
        suffix = self.path.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return "yaml"
        if suffix == ".env":
            return "env"
        return "json"


def render(kind: str, value: Mapping[str, Any]) -> str:
    """The file's text for ``value``."""
    if kind == "json":
        return json.dumps(value, indent=2, sort_keys=True) + "\n"
    if kind == "yaml":
        return yaml.safe_dump(dict(value), sort_keys=True, default_flow_style=False)
    lines = []
    for key, item in value.items():
        text = _env_text(item)
        if text == "" or re.search(r"[\s\"'\\$`#]", text):
            escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
            text = f'"{escaped}"'
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def _env_text(item: Any) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    return "" if item is None else str(item)


class FileBackend:
    def __init__(self, params: FileParams) -> None:
        self.params = params
        # A file that reads restored says nothing of whether its reload command ran (a crash may
        # have cut it short): with one, a change whose outcome is unknown is made again.
        self.confirms = params.reload is None

    async def set(self, value: Any, what: str) -> str:
        p = self.params
        text = render(p.kind, value)
        try:
            current = await asyncio.to_thread(read_or_none, p.path)
            if current != text:
                target = await asyncio.to_thread(write_target, p.path)
                await asyncio.to_thread(write_atomically, p.path, text)
                done = f"wrote {target}" + (f" (the file {p.path} links to)" if target != p.path else "")
                if await asyncio.to_thread(read_or_none, p.path) != text:  # read back: what a router reads
                    raise BackendError(f"{what}: {p.path} does not read back as written")
            else:
                done = f"{p.path} already says so"
        except OSError as exc:
            raise BackendError(f"{what}: cannot write {p.path}: {exc.strerror or exc}") from None
        if p.reload is None:
            return done
        try:
            return f"{done}; {await run_command(p.reload, p.reload_timeout, what)}"
        except CommandError as exc:
            raise BackendError(str(exc)) from None

    async def read(self, engage: Any, restore: Any) -> str | None:
        p = self.params
        try:
            text = await asyncio.to_thread(read_or_none, p.path)
        except OSError:
            return None
        if text is None:
            return None
        if text == render(p.kind, engage):
            return "engaged"
        if text == render(p.kind, restore):
            return "restored"
        return None
