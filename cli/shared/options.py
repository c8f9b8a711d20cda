"""The options several commands share: ``--config``, ``--scrape``/``--prometheus``, the
configuration overrides the command line makes, and who is at the keyboard (the default author)."""

from __future__ import annotations

import argparse
import getpass
import os
from pathlib import Path
from typing import Any


def who() -> str:
    """The person at the keyboard, as a step or a silence records it: the user behind sudo, else
    this one; "?" when the system has no name for it."""
    try:
        return os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (a bare container)
        return "?"


def add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        "-c",
        type=Path,
        default=os.environ.get("SPECGUARD_CONFIG") or None,
        help="specguard.yaml (default: $SPECGUARD_CONFIG, else built-in defaults)",
    )


def add_source_overrides(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--scrape",
        metavar="URL",
        action="append",
        help="read this vLLM /metrics URL directly (repeatable); replaces the configured sources",
    )
    group.add_argument(
        "--prometheus", metavar="URL", help="query this Prometheus; replaces the configured sources"
    )


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if getattr(args, "scrape", None):
        out["sources"] = {"scrape": {"targets": args.scrape}}
    elif getattr(args, "prometheus", None):
        out["sources"] = {"prometheus": {"url": args.prometheus}}
    server = {
        key: str(Path.cwd() / value.expanduser()) if isinstance(value, Path) else value
        for key in ("listen", "port", "webhook_token_file")
        if (value := getattr(args, key, None)) is not None
    }
    if server:
        out["server"] = server
    for key in ("state_dir", "dry_run", "log_format"):
        value = getattr(args, key, None)
        if value is not None:
            # A path on the command line is relative to where the command runs (one in the config
            # file is relative to the file).
            out[key] = str(Path.cwd() / value.expanduser()) if isinstance(value, Path) else value
    return out


def parse_date(text: str, option: str) -> float:
    """A date on the command line (``2026-12-05``, ``2026-12-05T10:00``), UTC unless it says
    otherwise, as Unix seconds. Raises ValueError naming ``option``."""
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a date like 2026-12-05 or 2026-12-05T10:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
