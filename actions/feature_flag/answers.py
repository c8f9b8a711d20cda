"""Requests to the flag API and the canary's server, and their answers read as from a stranger:
the body up to ``max_response_size``, redirects followed only as ``follow_redirects`` allows (to
the same scheme, host and port, a few hops at most), and every answer saying which URL gave it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from yarl import URL

from specguard.common.http import MAX_RESPONSE_SIZE, TooLarge, read_limited, strict_json

FollowRedirects = Literal["never", "same_origin"]
MAX_REDIRECTS = 5  # hops followed at most, with ``same_origin``
REDIRECTS = (301, 302, 303, 307, 308)
QUOTE = 200  # of a body or a reason, the characters an outcome quotes


class AnswerError(Exception):
    """No usable answer: a redirect not followed, a body over the limit, a body that is not what
    was asked for. ``retry``: whether asking again may help (a body over the limit on a 5xx), or
    not (a redirect the configuration does not follow)."""

    def __init__(self, message: str, retry: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.retry = retry
        self.status = status


@dataclass(frozen=True)
class Answer:
    method: str
    asked: str  # the URL first asked
    url: str  # the URL that answered (``asked``, or where a followed redirect led)
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def where(self) -> str:
        """``PUT http://host/flags/x``, with where it was redirected from when it was."""
        moved = f" (redirected from {self.asked})" if self.url != self.asked else ""  # a hop followed
        return f"{self.method} {self.url}{moved}"

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def quote(self) -> str:
        """The body, cut to ``QUOTE`` characters and on one line, for an outcome."""
        return " ".join(self.text().split())[:QUOTE]

    def json(self) -> Any:
        """The body as JSON; AnswerError when it is not JSON, or holds ``NaN``, ``Infinity`` or a
        number too large for a float (``1e999``): no answer can mean them."""
        try:
            return strict_json(self.text())
        except ValueError as exc:  # JSONDecodeError among them
            reason = str(exc)[:QUOTE] or type(exc).__name__
            raise AnswerError(
                f"{self.where} answered {self.status} with a body that is not JSON: {reason}"
            ) from None


async def fetch(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    follow: FollowRedirects = "never",
    limit: int = MAX_RESPONSE_SIZE,
    **kwargs: Any,
) -> Answer:
    """Send the request and read its answer's body (``limit`` bytes at most). A redirect is
    followed only with ``follow: same_origin``, to the same scheme, host and port, keeping the
    method and body, ``MAX_REDIRECTS`` hops at most; otherwise AnswerError naming its Location.
    A body over ``limit``: AnswerError, with ``retry`` as the status would have it. Raises what
    aiohttp raises (ClientError) for a request that got no answer."""
    current = URL(url)
    seen = {str(current)}
    hops = 0
    while True:
        async with session.request(method, current, allow_redirects=False, **kwargs) as answer:
            status = answer.status
            answered = str(current) if hops else url
            where = f"{method} {answered}" + (f" (redirected from {url})" if hops else "")
            location = answer.headers.get("Location") if status in REDIRECTS else None
            if location is None:
                try:
                    body = await read_limited(answer, limit)
                except TooLarge as exc:
                    retry = status in (408, 429) or status >= 500 or 200 <= status < 300
                    raise AnswerError(f"{where} answered {status}: {exc}", retry, status) from None
                return Answer(method, url, answered, status, answer.headers, body)
        # the redirect's own body is not read: releasing the answer closes its connection
        shown = location[:QUOTE]
        if follow == "never":
            raise AnswerError(
                f"{where} answered {status}, a redirect to {shown}: not followed (follow_redirects: never)",
                status=status,
            )
        try:
            target = current.join(URL(location))
        except ValueError:
            raise AnswerError(
                f"{where} answered {status}, a redirect to {shown}: not a URL", status=status
            ) from None
        if not target.is_absolute() or target.origin() != current.origin():
            raise AnswerError(
                f"{where} answered {status}, a redirect to {shown}: another origin, not followed "
                "(follow_redirects: same_origin)",
                status=status,
            )
        if (status == 303 and method not in ("GET", "HEAD")) or (status in (301, 302) and method == "POST"):
            raise AnswerError(
                f"{where} answered {status}, a redirect to {shown} that would turn the {method} into "
                "a GET: not followed",
                status=status,
            )
        if str(target) in seen:
            raise AnswerError(
                f"{where} answered {status}, a redirect back to {target}: a loop", status=status
            )
        hops += 1
        if hops > MAX_REDIRECTS:
            raise AnswerError(
                f"{where} answered {status}, a redirect to {shown}: more than {MAX_REDIRECTS} redirects",
                status=status,
            )
        seen.add(str(target))
        current = target
