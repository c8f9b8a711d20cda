"""Whether a runbook link resolves, as on-call would follow it: an http(s) URL answers 2xx or 3xx
(HEAD, then GET when HEAD is refused; redirects are not followed, a 3xx is an answer), a file
(``file://`` or a path, relative to the rule file's folder) exists, and an anchor in a local
Markdown or HTML page names a heading or an element there. An anchor on a remote page is not
looked for: pages often make their anchors with script."""

from __future__ import annotations

import asyncio
import html
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aiohttp

from specguard.preflight.item import Status

TIMEOUT = 10.0  # seconds, for each request
PAGE_LIMIT = 4 * 2**20  # bytes of a local page read for its anchors
MARKDOWN = (".md", ".markdown")
HTML = (".html", ".htm")

_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_ATTR_ID = re.compile(r"\{[^}]*#([\w:.-]+)[^}]*\}\s*$")
_HTML_ID = re.compile(r"""<[^>]+\s(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)


@dataclass(frozen=True)
class Resolved:
    status: Status  # pass: resolves; fail: does not; unknown: cannot be told from this host
    detail: str


def slugs(heading: str) -> set[str]:
    """The anchors a heading gets: MkDocs' (Python-Markdown's toc) and GitHub's."""
    text = re.sub(r"<[^>]+>|`", "", heading).strip()
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    toc = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())
    github = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    return {toc, github}


def anchors(text: str, markdown: bool) -> set[str]:
    """Every anchor a page has: its headings' (Markdown), ``{#id}`` attributes, ``id=``/``name=``."""
    found = {html.unescape(m) for m in _HTML_ID.findall(text)}
    if markdown:
        for heading in _HEADING.findall(text):
            explicit = _ATTR_ID.search(heading)
            if explicit:
                found.add(explicit[1])
                heading = heading[: explicit.start()]
            found |= slugs(heading)
    return found


def _local(path: Path, fragment: str) -> Resolved:
    if not path.is_file():
        return Resolved(Status.FAIL, f"no such file: {path}")
    if not fragment:
        return Resolved(Status.PASS, f"file {path} exists")
    suffix = path.suffix.lower()
    if suffix not in MARKDOWN + HTML:
        return Resolved(
            Status.PASS, f"file {path} exists (#{fragment} not looked for in a {suffix or 'plain'} file)"
        )
    with path.open("rb") as page:
        text = page.read(PAGE_LIMIT).decode("utf-8", "replace")
    if fragment in anchors(text, suffix in MARKDOWN):
        return Resolved(Status.PASS, f"file {path} has #{fragment}")
    return Resolved(Status.FAIL, f"file {path} exists, but has no anchor #{fragment}")


async def _http(session: aiohttp.ClientSession, url: str) -> Resolved:
    try:
        status = 0
        for verb in ("HEAD", "GET"):  # some servers refuse HEAD (405, 403, 404...): ask as a browser
            async with session.request(verb, url, allow_redirects=False) as response:
                status = response.status
                where = response.headers.get("Location", "")
            if status < 400:
                break
    except aiohttp.ClientConnectorDNSError as exc:
        return Resolved(Status.FAIL, f"{url}: no such host ({exc.host})")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Resolved(
            Status.UNKNOWN, f"{url}: not reachable from this host: {type(exc).__name__}: {exc}"[:300]
        )
    if 200 <= status < 300:
        return Resolved(Status.PASS, f"{url}: HTTP {status}")
    if 300 <= status < 400:
        return Resolved(Status.PASS, f"{url}: HTTP {status} to {where[:120]!r} (not followed)")
    return Resolved(Status.FAIL, f"{url}: HTTP {status}")


async def resolve(link: str, base: Path | None, session: aiohttp.ClientSession) -> Resolved:
    """Whether ``link`` resolves; ``base``: the folder a relative path is read from (None: none)."""
    parts = urlsplit(link)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            return Resolved(Status.FAIL, f"{link}: no host")
        return await _http(session, link)
    if scheme == "file":
        return await asyncio.to_thread(_local, Path(unquote(parts.path)), unquote(parts.fragment))
    if scheme and len(scheme) > 1:  # (a one-letter scheme is a Windows drive)
        return Resolved(Status.FAIL, f"{link}: a {scheme}: link is not a page on-call can open")
    path = Path(unquote(parts.path))
    if not path.is_absolute():
        if base is None:
            return Resolved(Status.FAIL, f"{link}: a relative link in a shipped rule pack has no folder")
        path = base / path
    return await asyncio.to_thread(_local, path, unquote(parts.fragment))


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=TIMEOUT), headers={"User-Agent": "specguard-preflight"}
    )
