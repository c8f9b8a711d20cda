"""``specguard status``: the running daemon's own view, read from its ``/api/status`` (as
``systemctl status`` reads a unit's): its health, the targets, every rule's state per series, the
fallbacks, the runs that wait, the silences, the ladders and the store. The page at ``/`` shows
the same (``daemon.statusview`` words both).

The exit code says what the daemon's state comes to, so scripts and health checks can use it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from collections.abc import Callable, Mapping
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import aiohttp

from specguard.cli.shared.options import add_config
from specguard.daemon.statusview import Cell, Condition, Section, Tone, View, build

MAX_BODY = 64 * 1024 * 1024  # a status of many thousands of series is a few MB


class Exit(IntEnum):
    """``specguard status``'s exit codes (docs/status.md lists them)."""

    HEALTHY = 0
    UNHEALTHY = 1  # the daemon answers but is not doing its job: rounds late, or the store failing
    USAGE = 2  # a bad option, or a config whose server section cannot be read
    UNREACHABLE = 3  # nothing answers at the address: not running, another port, a firewall
    NOT_SPECGUARD = 4  # something answers, but not with a specguard daemon's status
    DEGRADED = 5  # the daemon runs, but a target is down, a rule is in error or an action is failing


EXIT_OF = {
    Condition.HEALTHY: Exit.HEALTHY,
    Condition.DEGRADED: Exit.DEGRADED,
    Condition.UNHEALTHY: Exit.UNHEALTHY,
}


class Unreachable(Exception):
    pass


class NotSpecguard(Exception):
    pass


def add_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="the running daemon's own view: health, targets, rules, fallbacks, actions, silences, ladders",
        description="Ask the running daemon (its /api/status) what it sees now: its health, each "
        "target, each rule's state per series with value, threshold, verdict and since when, the "
        "fallbacks and what holds them (or why they cannot be written), what each action says of "
        "itself (a notifier's backlog and last error), the runs that wait and why, the silences, "
        "the ladders' k and the store. The page at the daemon's / shows the same.",
        epilog="exit codes: 0 healthy; 1 unhealthy (rounds late, or the store cannot be written); "
        "2 usage; 3 the daemon does not answer; 4 what answers is not a specguard daemon; "
        "5 degraded (a target down, a rule in error, or an action failing: a flag that cannot be "
        "written, notices failed for good).",
    )
    add_config(status)
    status.add_argument(
        "--url",
        metavar="URL",
        help="the daemon's address, e.g. http://127.0.0.1:9464 (default: the config's server.listen and port)",
    )
    status.add_argument("--json", action="store_true", help="print /api/status as the daemon returns it")
    status.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait this long for the answer (default 10)",
    )


def cmd_status(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        print("specguard status: --timeout must be positive", file=sys.stderr)
        return Exit.USAGE
    try:
        base = _base_url(args.url) if args.url else address(args.config)
    except ValueError as exc:
        print(f"specguard status: {exc}", file=sys.stderr)
        return Exit.USAGE
    try:
        document = asyncio.run(fetch(base, args.timeout))
        view = build(document)
    except Unreachable as exc:
        print(f"specguard status: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    except NotSpecguard as exc:
        print(f"specguard status: {exc}", file=sys.stderr)
        return Exit.NOT_SPECGUARD
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"specguard status: {base}/api/status is not a specguard daemon's status ({type(exc).__name__}: "
              f"{exc})", file=sys.stderr)  # fmt: skip
        return Exit.NOT_SPECGUARD
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_view(view, base, sys.stdout, _colour(sys.stdout))
    return EXIT_OF[view.condition]


def address(config: Path | None) -> str:
    """The daemon's base URL from the config's ``server`` section (the rest of the config is the
    daemon's business: its errors do not stop a status). Raises ValueError naming the problem."""
    from pydantic import ValidationError

    from specguard.common.yamlfile import FileProblems, load_yaml, validation_problems
    from specguard.config.schema import ServerConfig

    data: Any = {}
    if config is not None:
        try:
            data = load_yaml(config) or {}
        except FileProblems as exc:
            raise ValueError("; ".join(str(p) for p in exc.problems)) from None
    raw = data.get("server", {}) if isinstance(data, Mapping) else None
    if not isinstance(raw, Mapping):
        raise ValueError(f"{config}: server: a mapping (listen, port...) is expected")
    try:
        server = ServerConfig.model_validate(raw, context={"base": config.parent if config else Path.cwd()})
    except ValidationError as exc:
        problems = validation_problems(str(config), data, exc, prefix=("server",))
        raise ValueError("; ".join(str(p) for p in problems)) from None
    host = (
        "127.0.0.1" if server.listen in ("0.0.0.0", "") else "::1" if server.listen == "::" else server.listen
    )
    return f"http://{'[' + host + ']' if ':' in host else host}:{server.port}"


def _base_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {text!r}: give the daemon's address, e.g. http://127.0.0.1:9464")
    try:
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError as exc:
        raise ValueError(f"--url {text!r}: {exc}") from None
    return text.rstrip("/").removesuffix("/api/status")


async def fetch(base: str, timeout: float) -> dict[str, Any]:
    """The daemon's /api/status. Raises Unreachable when nothing answers, NotSpecguard when what
    answers is not a specguard daemon."""
    url = f"{base}/api/status"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url, headers={"Accept": "application/json"}, allow_redirects=False) as answer,
        ):
            body = await answer.content.read(MAX_BODY + 1)
            status, reason = answer.status, answer.reason
    except aiohttp.ClientConnectorError as exc:
        why = _connect_error(exc.os_error)
        raise Unreachable(f"nothing answers at {base} ({why}): is the daemon running, and on this address? "
                          "(systemctl status specguard; --url or --config give the address)") from None  # fmt: skip
    except TimeoutError:
        raise Unreachable(f"{base} did not answer within {timeout:g}s (a busy host: try --timeout)") from None
    except aiohttp.ClientError as exc:
        raise NotSpecguard(
            f"{base} does not answer as an HTTP server does ({type(exc).__name__}: {exc})"
        ) from None
    if status != 200:
        raise NotSpecguard(
            f"{url} answered HTTP {status} {reason or ''}: is this specguard's address?".replace(" :", ":")
        )
    if len(body) > MAX_BODY:
        raise NotSpecguard(f"{url} answered with more than {MAX_BODY // 2**20} MB: not a specguard status")
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotSpecguard(f"{url} did not answer with JSON ({exc}): is this specguard's address?") from None
    if not isinstance(document, dict) or not {"version", "rules", "sources"} <= document.keys():
        raise NotSpecguard(f"{url} answered JSON without a specguard status's version, sources and rules: "
                           "is this specguard's address?")  # fmt: skip
    return document


def _connect_error(error: OSError | None) -> str:
    """``connection refused``, ``Name or service not known``..."""
    if error is None:
        return "no connection"
    if not isinstance(error, socket.gaierror) and error.errno is not None and error.errno > 0:
        return os.strerror(error.errno).lower()
    return error.strerror or str(error)


# --- text ---------------------------------------------------------------------------------------

_ANSI = {Tone.GOOD: "32", Tone.WARN: "33", Tone.BAD: "1;31", Tone.MUTED: "2"}
_CONDITION_TONE = {Condition.HEALTHY: Tone.GOOD, Condition.DEGRADED: Tone.WARN, Condition.UNHEALTHY: Tone.BAD}


def _colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def print_view(view: View, base: str, out: TextIO, colour: bool = False) -> None:
    def paint(cell: Cell, width: int = 0) -> str:
        text = cell.text.ljust(width)
        if colour and cell.tone in _ANSI:
            return f"\033[{_ANSI[cell.tone]}m{cell.text}\033[0m" + text[len(cell.text) :]
        return text

    tone = _CONDITION_TONE[view.condition]
    firing = f"{len(view.firing)} firing ({', '.join(view.firing)})" if view.firing else "none firing"
    out.write(f"{paint(Cell('●', tone))} specguard {view.version} at {base}: {paint(Cell(view.condition.value, tone))}, "
              f"{paint(Cell(firing, Tone.BAD if view.firing else Tone.PLAIN))}\n")  # fmt: skip
    for problem in view.problems:
        out.write(f"  {paint(Cell('!', tone))} {problem}\n")
    width = max(len(name) for name, _ in view.facts)
    for name, cell in view.facts:
        out.write(f"  {name.rjust(width)}: {paint(cell)}\n")
    for section in view.sections:
        out.write("\n")
        _print_section(section, out, paint)


def _print_section(section: Section, out: TextIO, paint: Callable[[Cell, int], str]) -> None:
    out.write(section.title + "\n")
    if section.note:
        out.write(f"  {section.note}\n")
    if not section.rows:
        out.write(f"  {section.empty}\n")
        return
    widths = [len(h) for h in section.header]
    for row in section.rows:
        widths = [max(w, len(cell.text)) for w, cell in zip(widths, row.cells, strict=True)]
    out.write(
        "  " + "  ".join(h.ljust(w) for h, w in zip(section.header, widths, strict=True)).rstrip() + "\n"
    )
    for row in section.rows:
        cells = [paint(cell, w) for cell, w in zip(row.cells, widths, strict=True)]
        out.write(("  " + "  ".join(cells)).rstrip() + "\n")
        for note in row.notes:
            out.write(f"      {note}\n")
