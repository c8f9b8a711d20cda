"""Secrets read from files (systemd credentials, mounted secrets) or the environment, never from
the YAML itself. The daemon's config and the actions both read them, so they live below both."""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from specguard.common.paths import ConfigPath


def read_secret(path: Path, what: str) -> str:
    """The file's content without surrounding whitespace (Alertmanager strips a trailing newline
    too). Raises ValueError naming the file and the problem, never the secret."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ValueError(f"{what} {path}: cannot read it ({reason})") from None
    return _checked(secret, f"{what} {path}")


def _checked(secret: str, where: str) -> str:
    if not secret:
        raise ValueError(f"{where} is empty")
    # Whitespace inside would be an invalid header, and HTTP libraries quote the value in errors.
    if any(ch.isspace() or not ch.isprintable() for ch in secret):
        raise ValueError(f"{where}: it holds whitespace or control characters inside")
    return secret


class SecretRef(BaseModel):
    """Where a secret is: ``{file: PATH}``, ``{credential: NAME}`` (a systemd credential, read from
    ``$CREDENTIALS_DIRECTORY/NAME``, given with ``LoadCredential=``) or ``{env: VARIABLE}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: ConfigPath | None = None
    credential: str | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        given = [name for name in ("file", "credential", "env") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of `file`, `credential` or `env`")
        if self.credential is not None and (not self.credential or "/" in self.credential):
            raise ValueError("a credential is a plain name, as in LoadCredential=NAME:PATH")
        return self

    def describe(self) -> str:
        """Where the secret is read from, for messages (never the secret itself)."""
        if self.file is not None:
            return f"file {self.file}"
        if self.credential is not None:
            return f"systemd credential {self.credential}"
        return f"environment variable {self.env}"

    def read(self, what: str, environ: Mapping[str, str] | None = None) -> str:
        """The secret. Raises ValueError naming where it was looked for, never its value."""
        env = os.environ if environ is None else environ
        if self.file is not None:
            return read_secret(self.file, f"{what} file")
        if self.credential is not None:
            directory = env.get("CREDENTIALS_DIRECTORY")
            if not directory:
                raise ValueError(
                    f"{what}: credential {self.credential!r} needs $CREDENTIALS_DIRECTORY "
                    "(systemd sets it for a unit with LoadCredential=)"
                )
            return read_secret(Path(directory) / self.credential, f"{what} credential")
        assert self.env is not None
        value = env.get(self.env)
        if value is None:
            raise ValueError(f"{what}: environment variable {self.env} is not set")
        return _checked(value.strip(), f"{what} in ${self.env}")


def read_if_given(ref: SecretRef | None, what: str) -> str | None:
    """``ref``'s secret, or None when no secret is configured. Raises ValueError as ``read``."""
    return None if ref is None else ref.read(what)


def bearer_matches(header: str, secret: str) -> bool:
    """Whether an ``Authorization`` header carries ``secret`` as a bearer token. The scheme is
    case-insensitive (RFC 9110); the token is compared in constant time."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), secret.encode()
    )
