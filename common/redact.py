"""Secrets in URLs stay out of logs, status answers and error messages.

A target may carry credentials (``http://admin:pw@host/metrics``) or a token in its query string
(``?token=...``). :func:`shown` is the URL as specguard prints it; :func:`scrub` removes the same
secrets from any text that may have quoted the URL (an exception's message, say).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

REDACTED = "<redacted>"
# Query parameters whose values are secrets by their name.
SECRET_PARAMETER = re.compile(
    r"(token|key|secret|passw(or)?d|pwd|auth|sig(nature)?|credential|session|cookie)", re.IGNORECASE
)


def secrets_of(url: str) -> list[str]:
    """The secret parts of ``url``: its password (and user), and secret-looking query values."""
    parts = urlsplit(url)
    found = [value for value in (parts.password, parts.username) if value]
    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        if SECRET_PARAMETER.search(name) and value:
            found.append(value)
    # A library may quote back the encoded form, or the decoded one.
    forms = {*found, *(quote(value, safe="") for value in found), *(unquote(value) for value in found)}
    return sorted(forms, key=len, reverse=True)


def shown(url: str) -> str:
    """``url`` without its user information, and with secret query values replaced."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    query = "&".join(
        f"{name}={REDACTED if SECRET_PARAMETER.search(name) else value}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def scrub(text: str, url: str) -> str:
    """``text`` with ``url`` and each of its secrets replaced. A secret is replaced where it stands
    as a word of its own, so a short user name does not garble every word that contains it."""
    text = text.replace(url, shown(url))
    for secret in secrets_of(url):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", REDACTED, text)
    return text
