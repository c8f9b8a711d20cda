"""Slack's Web API and incoming webhooks, as the ``slack`` action calls them: over aiohttp, each
answer read as from a stranger (``common.http``: the body up to ``max_response_size``, JSON without
non-finite numbers, ``Retry-After`` finite and capped), and every way a call can end sorted into
delivered, ``Retry`` (try again later) or ``Failed`` (never will: a revoked token, a channel the bot
is not in, a 4xx).

The calls are sent here rather than through slack-sdk's clients because those read every answer
whole (``await response.json()``), with no way to bound it: an endless or huge answer would be held
in memory before anything could refuse it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from specguard.common.http import TooLarge, json_limited, read_limited, retry_after

# Errors that no amount of waiting mends (Slack's documented ``error`` codes of the methods called
# here): the notice is marked failed for good. Any other ``ok: false`` is tried again.
PERMANENT = frozenset(
    {
        # the token
        "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
        "no_permission", "missing_scope", "not_allowed_token_type", "ekm_access_denied",
        "team_access_not_granted", "org_login_required", "two_factor_setup_required",
        # the channel
        "channel_not_found", "not_in_channel", "is_archived", "restricted_action",
        "restricted_action_read_only_channel", "restricted_action_thread_only_channel",
        "restricted_action_non_threadable_channel",
        # the message
        "msg_too_long", "no_text", "invalid_blocks", "invalid_blocks_format", "too_many_attachments",
        "invalid_metadata_format", "invalid_metadata_schema", "metadata_too_large",
        "message_not_found", "cant_update_message", "cant_delete_message", "edit_window_closed",
        "invalid_thread_ts", "thread_not_found", "cannot_reply_to_message",
        # the request
        "invalid_arguments", "invalid_arg_name", "invalid_array_arg", "invalid_charset",
        "invalid_form_data", "invalid_post_type", "missing_post_type", "method_deprecated",
        "deprecated_endpoint", "unknown_method",
    }
)  # fmt: skip
REASON_MAX = 200  # characters of an error answer kept as the reason


class Retry(Exception):
    """Not delivered, try again (after ``after`` seconds, or the backoff). ``unsent``: Slack
    surely did not post it (a 429), so the next try need not look for it first."""

    def __init__(self, why: str, after: float | None = None, unsent: bool = False) -> None:
        super().__init__(why)
        self.after = after
        self.unsent = unsent


class Failed(Exception):
    """Not delivered, and trying again will not help (a revoked token, a channel not found, a
    4xx): the notice is marked failed for good, with this reason."""


class Skipped(Exception):
    """Not delivered, and never will be (a chart whose file is gone): dropped, with a note."""


class Slack:
    """One delivery's calls, on one aiohttp session (``async with``)."""

    def __init__(
        self,
        *,
        token: str | None,
        base_url: str,
        timeout: float,
        limit: int,
        cap: float,
    ) -> None:
        self.token = token
        self.base_url = base_url
        self.timeout = timeout
        self.limit = limit  # max_response_size
        self.cap = cap  # max_backoff: the longest Retry-After obeyed
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Slack:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use Slack as `async with`"
        return self._session

    async def call(
        self,
        method: str,
        *,
        json_body: dict[str, Any] | None = None,
        form: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Web API method's answer when ``ok``; Retry or Failed otherwise. Arguments go as JSON
        (the ``chat.*`` methods), a form (``files.*``) or a GET's query (the read methods)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        verb = "GET" if query is not None else "POST"
        try:
            async with self.session.request(
                verb,
                self.base_url + method,
                json=json_body,
                data=form,
                params=query,
                headers=headers,
                allow_redirects=False,
            ) as response:
                _refuse_status(response, method, await _reason(response, self.limit), self.cap)
                answer = await json_limited(response, self.limit)
        except (Retry, Failed):
            raise
        except TooLarge as exc:
            raise Retry(f"{method}: {exc}") from None
        except ValueError as exc:
            raise Retry(f"{method}: the answer is not JSON: {exc}"[:REASON_MAX]) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Retry(f"{method}: {type(exc).__name__}: {exc}"[:REASON_MAX]) from None
        if not isinstance(answer, dict):
            raise Retry(f"{method}: the answer is not a JSON object")
        if answer.get("ok") is True:
            return answer
        error = str(answer.get("error") or "no error given")[:REASON_MAX]
        if error in PERMANENT:
            raise Failed(f"{method}: {error}")
        if error == "ratelimited":
            raise Retry(f"{method}: {error}", self._retry_after(response), unsent=True)
        raise Retry(f"{method}: {error}")

    async def upload(self, url: str, data: bytes) -> None:
        """POST a file's bytes to the upload URL ``files.getUploadURLExternal`` handed out (no
        token: the URL is the credential)."""
        if not url.startswith(("https://", "http://")):
            raise Retry(f"files.getUploadURLExternal: no upload URL in the answer: {url!r}"[:REASON_MAX])
        await self._post("the upload", url, data=data)

    async def webhook(self, url: str, payload: dict[str, Any]) -> None:
        """Post through an incoming webhook, which answers ``ok`` as text (or a status with the
        error's name: 404 ``channel_not_found``, 403 ``action_prohibited``, ...)."""
        await self._post(
            "the webhook", url, data=json.dumps(payload), headers={"Content-Type": "application/json"}
        )

    async def _post(self, what: str, url: str, **kwargs: Any) -> None:
        """A POST whose answer says only whether it worked: its status, its body read up to the limit."""
        try:
            async with self.session.post(url, allow_redirects=False, **kwargs) as response:
                _refuse_status(response, what, await _reason(response, self.limit), self.cap)
                await read_limited(response, self.limit)
        except (Retry, Failed):
            raise
        except TooLarge as exc:
            raise Retry(f"{what}: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Retry(f"{what}: {type(exc).__name__}: {exc}"[:REASON_MAX]) from None

    def _retry_after(self, response: aiohttp.ClientResponse) -> float | None:
        return _after(response, self.cap)


def _after(response: aiohttp.ClientResponse, cap: float) -> float | None:
    """The answer's ``Retry-After`` in seconds (at least a second, at most ``cap``), or None
    when it has none that can be read: the outbox's own backoff applies."""
    seconds = retry_after(response.headers.get("Retry-After"), time.time(), cap)
    return None if seconds is None else min(max(seconds, 1.0), cap)


def _refuse_status(response: aiohttp.ClientResponse, what: str, reason: str, cap: float) -> None:
    """Retry or Failed for an answer that is not a 200: a 429 waits its Retry-After, a 408 or a
    5xx the backoff; any other 4xx is for good, and so is a redirect (not followed)."""
    status = response.status
    if status == 200:
        return
    said = f"{what}: {status} {reason}".strip()
    if status == 429:
        raise Retry(said, _after(response, cap), unsent=True)
    if status == 408 or status >= 500:
        raise Retry(said)
    if 300 <= status < 400:
        where = response.headers.get("Location", "")
        raise Failed(f"{said} (a redirect to {where[:100]!r}, not followed)")
    if 400 <= status < 500:
        raise Failed(said)
    raise Retry(said)


async def _reason(response: aiohttp.ClientResponse, limit: int) -> str:
    """What an answer that is not a 200 says: Slack's ``error`` of a JSON body, or the start of
    a text one (read within the limit). Empty for a 200, whose body is read by the caller."""
    if response.status == 200:
        return ""
    try:
        raw = await read_limited(response, limit)
    except TooLarge as exc:
        return f"({exc})"
    except (aiohttp.ClientError, TimeoutError):
        return ""
    text = raw.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("error"):
        text = str(parsed["error"])
    return text[:100]
