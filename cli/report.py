"""``specguard report``: the report of a period, from the state database (the daemon may run)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from specguard.cli.shared.options import add_config, parse_date
from specguard.cli.shared.statedb import state_database

FORMATS = ("html", "md", "json")


def add_parser(sub: Any) -> None:
    report = sub.add_parser(
        "report",
        help="the weekly report: acceptance, speedup, latency against the baseline, what the rules did",
        description="Write the report of a period from the state database's history: acceptance by day "
        "and hour, per-position acceptance, estimated speedup and latency against the baseline, "
        "throughput, KV-cache usage, the rules that fired and how soon they acted, fallbacks, restarts, "
        "silences, the change from the period before, and recommendations with their reasoning (the k "
        "that maximises the expected speedup, hours where speculation lost, a degrading draft). Charts "
        "need the `charts` extra (matplotlib). The daemon writes one on its own on `report.schedule`.",
        epilog="Dates are UTC: 2026-11-30 or 2026-11-30T08:00. The period is [--from, --to).",
    )
    add_config(report)
    report.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    when = report.add_mutually_exclusive_group()
    when.add_argument("--since", metavar="DURATION", help="the period up to now, e.g. 7d (the default), 24h")
    when.add_argument("--from", dest="start", metavar="DATE", help="the period's start (with --to)")
    report.add_argument("--to", dest="end", metavar="DATE", help="the period's end (default: now)")
    report.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        help="html (one self-contained file, the default), md (with the charts beside it), json; "
        "give it more than once for several",
    )
    report.add_argument(
        "--out", type=Path, default=Path("."), metavar="DIR", help="where to write (default .)"
    )


def period(args: argparse.Namespace, now: float) -> tuple[float, float]:
    """[start, end) from the options; ValueError with the option's name when they are wrong."""
    from specguard.rules.durations import parse_duration

    if args.end is not None and args.start is None:
        raise ValueError("--to needs --from")
    if args.start is not None:
        start = parse_date(args.start, "--from")
        end = parse_date(args.end, "--to") if args.end is not None else now
    else:
        try:
            span = parse_duration(args.since or "7d")
        except ValueError as exc:
            raise ValueError(f"--since: {exc}") from None
        start, end = now - span, now
    if end <= start:
        raise ValueError("the period is empty: --to must come after --from")
    return start, end


def cmd_report(args: argparse.Namespace) -> int:
    from specguard.config.loading import load
    from specguard.report import weekly
    from specguard.store.database import StoreError, opened

    try:
        start, end = period(args, time.time())
    except ValueError as exc:
        print(f"specguard report: {exc}", file=sys.stderr)
        return 2
    path = state_database(args, "report")
    if path is None:
        return 1
    overrides = {"state_dir": str(path.parent)}
    loaded = load(args.config, (), overrides)
    formats = tuple(dict.fromkeys(args.format or ["html"]))

    async def make() -> list[Path]:
        async with opened(path) as store:
            remedies = [name for name, action in loaded.actions.items() if action.changes_world]
            _, paths = await weekly.make(
                store,
                start,
                end,
                formats,
                args.out,
                loaded.baseline,
                remedies=remedies,
                routing=loaded.config.routing,
            )
            return paths

    try:
        paths = asyncio.run(make())
    except StoreError as exc:
        print(f"specguard report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"specguard report: cannot write into {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    missing = weekly.charts_missing()
    if missing is not None:
        print(f"specguard report: no charts: {missing}", file=sys.stderr)
    for written in paths:
        print(written)
    return 0
