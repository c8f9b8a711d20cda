"""``specguard silence``: add a silence (its rule named as the config or the state database knows
it, held to the config's longest silence), expire one, list them."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specguard.cli import rulenames


def cmd_silence(
    args: argparse.Namespace,
    state_database: Callable[[argparse.Namespace, str, list[Any]], Path | None],
    print_columns: Callable[..., None],
) -> int:
    from functools import partial

    from specguard.dispatch import silences
    from specguard.dispatch.api import plain
    from specguard.rules.durations import parse_duration
    from specguard.store.database import StoreError, opened

    now = time.time()
    if args.verb == "add":
        try:
            match = silences.parse_match(args.match)
            ends = now + parse_duration(args.duration)
            silences.check(args.rule, match, now, ends, args.reason, longest=math.inf)  # before the config
            author = args.author or os.environ.get("SUDO_USER") or os.environ.get("USER") or "?"
            plain("author", author, silences.MAX_NAME)
        except ValueError as exc:
            print(f"specguard silence add: {exc}", file=sys.stderr)
            return 2
    loaded: list[Any] = []
    path = state_database(args, "silence", loaded)
    if path is None:
        return 1
    if args.verb == "add":
        try:  # the longest silence is the config's (server.max_silence)
            silences.check(
                args.rule, match, now, ends, args.reason, longest=loaded[0].config.server.max_silence
            )
        except ValueError as exc:
            print(f"specguard silence add: {exc}", file=sys.stderr)
            return 2
    unmatched: list[str] = []

    async def act() -> Any:
        async with opened(path) as store:
            if args.verb == "add":
                recorded = await store.call(rulenames.recorded_rules, synced=False)
                mistake = rulenames.silence_mistake(loaded[0], args.rule, recorded, hint=not args.force)
                if mistake is not None:
                    unmatched.append(mistake)
                    if not args.force:
                        return None
                return await store.call(
                    partial(silences.add, rule=args.rule, match=match, starts=now, ends=ends, reason=args.reason,
                            author=author, now=now, longest=loaded[0].config.server.max_silence)
                )  # fmt: skip
            if args.verb == "expire":
                return await store.call(partial(silences.expire, silence_id=args.id, now=now))
            return await store.call(partial(silences.listed, now=now, everything=args.all))

    try:
        result = asyncio.run(act())
    except StoreError as exc:
        print(f"specguard silence: {exc}", file=sys.stderr)
        return 1
    if args.verb == "add":
        if result is None:
            print(f"specguard silence add: {unmatched[0]}", file=sys.stderr)
            print("(--force adds the silence all the same, for a rule about to be deployed)", file=sys.stderr)
            return rulenames.USAGE
        print(f"silence {result.id}: {_silence_line(result)}")
        if unmatched:
            print(
                f"specguard silence add: warning: added with --force: {unmatched[0]}; it holds nothing "
                "back until such a rule runs",
                file=sys.stderr,
            )
        return 0
    if args.verb == "expire":
        if result is None:
            print(f"specguard silence expire: no silence {args.id}", file=sys.stderr)
            return 1
        print(f"silence {result.id} ended: {_silence_line(result)}")
        return 0
    if args.format == "json":
        from dataclasses import asdict

        print(json.dumps([asdict(item) for item in result], indent=2))
        return 0
    table = [("ID", "RULE", "MATCH", "ENDS (UTC)", "STATE", "AUTHOR", "REASON")]
    for item in result:
        table.append(
            (
                str(item.id),
                item.rule,
                _match_text(item.match),
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(item.ends)),
                _silence_state(item, now),
                item.author,
                item.reason,
            )
        )
    print_columns(table)
    return 0


def _match_text(match: dict[str, Any]) -> str:
    parts = []
    for label, spec in match.items():
        if isinstance(spec, dict):
            ((op, value),) = spec.items()
            parts.append(f"{label}{op}{value}")
        else:
            parts.append(f"{label}={spec}")
    return ",".join(parts) or "-"


def _silence_state(item: Any, now: float) -> str:
    if item.expired is not None:
        return "expired"
    if item.ends <= now:
        return "ended"
    return "active" if item.starts <= now else "pending"


def _silence_line(item: Any) -> str:
    end = item.ends if item.expired is None else item.expired
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(end))
    when = f"until {stamp}" if item.expired is None else f"at {stamp}"
    where = _match_text(item.match)
    return f"rule {item.rule}" + (f" where {where}" if where != "-" else "") + f", {when} ({item.reason})"
