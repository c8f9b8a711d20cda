"""Secrets read from files (systemd credentials, mounted secrets), never from the YAML itself."""

from __future__ import annotations

from pathlib import Path


def read_secret(path: Path, what: str) -> str:
    """The file's content without surrounding whitespace (Alertmanager strips a trailing newline
    too). Raises ValueError naming the file and the problem, never the secret."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ValueError(f"{what} {path}: cannot read it ({reason})") from None
    if not secret:
        raise ValueError(f"{what} {path} is empty")
    # Whitespace inside would be an invalid header, and HTTP libraries quote the value in errors.
    if any(ch.isspace() or not ch.isprintable() for ch in secret):
        raise ValueError(f"{what} {path}: it holds whitespace or control characters inside")
    return secret
