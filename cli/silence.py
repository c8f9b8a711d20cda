"""``specguard silence``: add a silence (its rule named as the config or the state database knows
it, held to the config's longest silence), expire one, list them."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from specguard.cli.shared import rulenames
from specguard.cli.shared.options import add_config, who
from specguard.cli.shared.printing import print_columns
from specguard.cli.shared.statedb import state_database
from specguard.daemon.statustext import match_text


def add_parser(sub: Any) -> None:
    silence = sub.add_parser(
        "silence",
        help="hold a rule's actions back for a while: add, list, expire",
        description="A silence holds back the actions of a rule's firings (those whose labels "
        "match) until it ends: each held-back run is recorded with the silence's id and reason. "
        "Silences live in the state database of the config's state_dir (or --state-dir), which "
        "the running daemon reads at each firing; the HTTP API (/api/silences) manages the same.",
    )
    verbs = silence.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser("add", help="add a silence", description="Add a silence, starting now.")
    add.add_argument(
        "--rule",
        required=True,
        help="the rule's name, or a glob (acceptance_*); one that matches no rule is refused (exit 2)",
    )
    add.add_argument(
        "--match",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="only series whose labels match (=, !=, =~, !~); repeat for several",
    )
    add.add_argument("--for", dest="duration", required=True, metavar="DURATION", help="how long, e.g. 2h")
    add.add_argument("--reason", required=True, help="why, for whoever is on call next")
    add.add_argument("--author", help="who (default: $SUDO_USER, else your user name)")
    add.add_argument(
        "--force",
        action="store_true",
        help="add it even when no rule of the config matches --rule (a rule about to be deployed)",
    )
    listing = verbs.add_parser("list", help="the silences in force and to come")
    listing.add_argument("--all", action="store_true", help="ended and expired ones too")
    listing.add_argument("--format", choices=["table", "json"], default="table", help="default table")
    ending = verbs.add_parser("expire", help="end a silence now")
    ending.add_argument("id", type=int, help="the silence's id (see `silence list`)")
    for verb in (add, listing, ending):
        add_config(verb)
        verb.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")


def cmd_silence(args: argparse.Namespace) -> int:
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
            author = args.author or who()
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
                return await store.call(partial(silences.end, silence_id=args.id, now=now))
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
        silence, ended = result
        if silence is None:
            print(f"specguard silence expire: no silence {args.id}", file=sys.stderr)
            return 1
        if not ended:  # as the API (404) and the status page (409) say it
            print(f"specguard silence expire: silence {args.id} had already ended", file=sys.stderr)
            return 1
        print(f"silence {silence.id} ended: {_silence_line(silence)}")
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
                match_text(item.match),
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(item.ends)),
                _silence_state(item, now),
                item.author,
                item.reason,
            )
        )
    print_columns(table)
    return 0


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
    where = match_text(item.match)
    return f"rule {item.rule}" + (f" where {where}" if where != "-" else "") + f", {when} ({item.reason})"
