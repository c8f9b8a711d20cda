"""``specguard history``: the rules' state changes from the state database, newest first, with
their trigger, what they said and their action runs; ``--drills``: the fallback drills
(``specguard preflight --drill``), each with its outcome and evidence."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from specguard.cli.shared import rulenames
from specguard.cli.shared.options import add_config
from specguard.cli.shared.printing import print_columns
from specguard.cli.shared.statedb import state_database


def add_parser(sub: Any) -> None:
    history = sub.add_parser(
        "history",
        help="what the rules did: state changes, their trigger and their action runs",
        description="List the latest state changes recorded in the state database, newest first: "
        "when, which rule and series, what triggered the evaluation (the schedule or an "
        "Alertmanager delivery), how each action run ended, and under each change what it said "
        "(the rule's message for that transition) and what its actions did later. Reads the database of the config's "
        "state_dir (or --state-dir); the daemon may be running.",
    )
    add_config(history)
    history.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    history.add_argument(
        "--rule",
        metavar="NAME",
        help="only this rule (of the config, or recorded in the database; else exit 2)",
    )
    history.add_argument("--since", metavar="DURATION", help="only changes this recent, e.g. 24h")
    history.add_argument("--limit", type=int, default=50, metavar="N", help="how many changes (default 50)")
    history.add_argument("--format", choices=["table", "json"], default="table", help="default table")
    history.add_argument(
        "--drills",
        action="store_true",
        help="the fallback drills (specguard preflight --drill) instead: when, the action, the outcome, "
        "how long the drill took, and under each what it saw",
    )


def _run_cell(run: dict[str, Any]) -> str:
    """``fallback:ok``, ``fallback(restore):pending``, ``fallback(hold):ok``, ``log:skipped
    (cooldown)``, ``oncall:deferred (silenced until 14:03:00)``."""
    mode = run.get("mode")
    name = run["action"] + (f"({mode})" if mode in ("restore", "hold") else "")
    cell = f"{name}:{run['status']}"
    if run["status"] in ("skipped", "deferred") and run.get("reason"):
        cell += f" ({run['reason'].split(':')[0]}"
        if run["status"] == "deferred" and run.get("not_before") is not None:
            cell += f" until {time.strftime('%H:%M:%S', time.gmtime(run['not_before']))}"
        cell += ")"
    return cell


def cmd_history(args: argparse.Namespace) -> int:
    from specguard.store.database import StoreError, opened

    since = None
    if args.since is not None:
        from specguard.rules.durations import parse_duration

        try:
            since = time.time() - parse_duration(args.since)
        except ValueError as exc:
            print(f"specguard history: --since: {exc}", file=sys.stderr)
            return 2
    if args.drills and args.rule is not None:
        print(
            "specguard history: --rule and --drills do not go together (a drill is no rule's)",
            file=sys.stderr,
        )
        return 2
    loaded: list[Any] = []
    path = state_database(args, "history", loaded)
    if path is None:
        return 1
    if args.drills:
        return _drills(path, max(1, args.limit), since, args.format)

    async def read() -> list[dict[str, Any]] | str:
        async with opened(path) as store:
            if args.rule is not None:
                recorded = await store.call(rulenames.recorded_rules, synced=False)
                mistake = rulenames.history_mistake(loaded[0], args.rule, recorded)
                if mistake is not None:
                    return mistake
            return await store.history(args.rule, max(1, args.limit), since)

    try:
        events = asyncio.run(read())
    except StoreError as exc:
        print(f"specguard history: {exc}", file=sys.stderr)
        return 1
    if isinstance(events, str):
        print(f"specguard history: {events}", file=sys.stderr)
        return rulenames.USAGE
    if args.format == "json":
        print(json.dumps(events, indent=2))
        return 0
    table = [("TIME (UTC)", "RULE", "LABELS", "CHANGE", "TRIGGER", "ACTIONS")]
    below: dict[int, list[str]] = {}
    for event in events:
        moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["at"]))
        labels = ",".join(f"{k}={v}" for k, v in sorted(event["labels"].items())) or "-"
        runs = ", ".join(_run_cell(run) for run in event["runs"]) or "-"
        change = f"{event['previous']} -> {event['kind']}"
        table.append((moment, event["rule"], labels, change, event["trigger"], runs))
        # what the event said (worded for its transition), then what the actions did later, in
        # time order under it: a Slack notice delivered
        below[len(table) - 1] = [f"said: {event['summary']}"] + [
            f"{time.strftime('%H:%M:%S', time.gmtime(note['at']))} {note['action']}: {note['text']}"
            for note in event["notes"]
        ]
    print_columns(table, below)
    return 0


def _drills(path: Path, limit: int, since: float | None, form: str) -> int:
    from specguard.store import drills
    from specguard.store.database import StoreError, opened

    async def read() -> list[drills.Drill]:
        async with opened(path) as store:
            return await store.call(lambda db: drills.latest(db, limit, since), synced=False)

    try:
        found = asyncio.run(read())
    except StoreError as exc:
        print(f"specguard history: {exc}", file=sys.stderr)
        return 1
    if form == "json":
        print(json.dumps([drill.as_json() for drill in found], indent=2))
        return 0
    if not found:
        print("no drill on record: run specguard preflight --drill")
        return 0
    table = [("STARTED (UTC)", "DRILL", "ACTION", "OUTCOME", "TOOK", "DETAIL")]
    below: dict[int, list[str]] = {}
    for drill in found:
        took = "-" if drill.finished is None else f"{drill.finished - drill.started:.1f}s"
        moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(drill.started))
        table.append((moment, f"#{drill.id}", drill.action, drill.outcome, took, drill.detail or "-"))
        below[len(table) - 1] = list(drill.evidence)
    print_columns(table, below)
    return 0
