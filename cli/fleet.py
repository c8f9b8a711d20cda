"""``specguard fleet status``: the fleet's coordination store as it is now (the config's
``coordination:`` section): who holds the restart and fallback slots, since when, for which
incident, how long their leases have left; the hosts registered; the restarts' budget used."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from specguard.cli.shared.options import add_config
from specguard.cli.shared.printing import print_columns

PROG = "specguard fleet"


def add_parser(sub: Any) -> None:
    fleet = sub.add_parser(
        "fleet",
        help="the fleet's coordination store: who holds restart and fallback slots, the budget used",
        description="Read the fleet's coordination store (etcd or Redis, the config's coordination: "
        "section) and show, for the restarts and the fallback: the limit now, each slot held (by which "
        "host and action, under which fencing token, since when, its lease's time left, for which "
        "incident), the hosts registered, and the restarts' hourly budget used. Exit 0; 1 when the "
        "store cannot be reached; 2 for a config without a coordination: section, or a bad one.",
    )
    verbs = fleet.add_subparsers(dest="verb", metavar="VERB", required=True)
    status = verbs.add_parser(
        "status", help="who holds slots, since when, for which incident; the budget used"
    )
    add_config(status)
    status.add_argument("--json", action="store_true", help="the same as JSON")


def cmd_fleet(args: argparse.Namespace) -> int:
    from specguard.config.loading import load
    from specguard.coordination.base import Unavailable
    from specguard.coordination.opening import ClientMissing, open_coordinator
    from specguard.coordination.status import gather

    loaded = load(args.config, ())
    if not loaded.ok:
        for problem in loaded.errors:
            print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    config = loaded.config.coordination
    if config is None:
        where = args.config or "the built-in defaults"
        print(f"{PROG}: {where} has no coordination: section: this host acts alone", file=sys.stderr)
        return 2
    try:
        coordinator = open_coordinator(config)
    except (ClientMissing, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    async def read() -> dict[str, Any]:
        try:
            return await gather(coordinator, config, time.time())
        finally:
            await coordinator.close()

    try:
        fleet = asyncio.run(read())
    except Unavailable as exc:
        print(f"{PROG}: the fleet's {config.store} at {config.url} cannot be reached: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(fleet, indent=2))
        return 0
    _print(fleet)
    return 0


def _ago(seconds: float) -> str:
    from specguard.rules.durations import format_duration

    return format_duration(round(seconds))


def _print(fleet: dict[str, Any]) -> None:
    hosts = fleet["hosts"]
    print(
        f"fleet: {fleet['store']} {fleet['url']}, prefix {fleet['prefix']}: {len(hosts)} host(s) registered"
    )
    for entry in fleet["semaphores"]:
        held = entry["holders"]
        limit = entry["limit"]
        line = f"{entry['semaphore']}: {len(held)} of {limit if limit is not None else '?'} slot(s) held"
        if entry["configured"]:
            line += f" ({entry['configured']})"
        budget = entry.get("budget")
        if budget is not None:
            line += f"; budget: {budget['used']} of {budget['limit']} restarts in the last {budget['window']}"
        print(line)
        if held:
            table = [["HOLDER", "TOKEN", "SINCE", "HELD FOR", "LEASE LEFT", "FOR"]]
            for h in held:
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h["since"])) + "Z"
                table.append([h["owner"], str(h["token"]), since, _ago(h["held_for"]), _ago(h["lease_left"]),
                              h["incident"] or "-"])  # fmt: skip
            print_columns(table)
    print("hosts: " + (", ".join(hosts) if hosts else "none registered"))
