"""``specguard backtest``: what rules would have done on recorded traffic (``backtest/``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

from specguard.cli.shared.options import add_config, parse_date

PROG = "specguard backtest"
MOST = 90 * 86400.0  # a longer period belongs in several runs

DESCRIPTION = """\
Replay recorded traffic through a rules file, before it goes live: the daemon's own engine,
sequential detector, guards and fallback controller run on a simulated clock over the period, in a
scratch state database, with the actions rehearsed (nothing in the world changes). For each rule and
series it shows when it would have gone pending, fired and resolved, which actions would have run and
which the guards would have deferred or skipped, and, against known incidents, the incidents it
caught or missed, its false alarms and the time from each incident's start to its first firing and
action. Firings the daemon recorded live over the period are matched with the replay's.

The traffic comes from the state database's per-minute history (the default) or from Prometheus
(--from-prometheus). History keeps minutes: a rule is evaluated once a minute at most and a window
reads whole minutes; each rule says what that changes. A rule on raw PromQL replays only from
Prometheus; an alert rule (fed by Alertmanager) not at all.

Exit status: 0 the backtest ran; 2 input that cannot be used (a bad option, rules, config,
incidents file or an unreadable state database), said in one line per problem.
"""

EPILOG = """\
examples:
  specguard backtest --rules candidate.yaml --since 7d
  specguard backtest --rules rules.yaml --rule acceptance_collapse --since 3d --until 2026-12-05
  specguard backtest --rules rules.yaml --compare candidate.yaml --incidents incidents.yaml
  specguard backtest --rules rules.yaml --from-prometheus http://127.0.0.1:9090 --since 2d --json
  specguard backtest --rules rules.yaml --html backtest.html --write proposed.yaml
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "backtest",
        help="what rules would have done on recorded traffic: firings, actions, missed incidents",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(parser)
    parser.add_argument("--rules", type=Path, metavar="FILE", required=True, help="the rules file to replay")
    parser.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    parser.add_argument(
        "--since", metavar="DURATION", default="7d", help="the period up to --until (default 7d)"
    )
    parser.add_argument(
        "--until", metavar="DATE", help="the period's end, UTC: 2026-12-05T10:00 (default: now)"
    )
    parser.add_argument(
        "--from-prometheus", metavar="URL", nargs="?", const="",
        help="replay from Prometheus: the config's sources.prometheus, or this URL (default: the state database's history)",
    )  # fmt: skip
    parser.add_argument(
        "--compare", type=Path, metavar="FILE", help="another rules file, replayed beside --rules"
    )
    parser.add_argument("--incidents", type=Path, metavar="FILE", help="known incidents (start, end, series)")
    parser.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--html", type=Path, metavar="FILE", help="also write a page with a timeline per series"
    )
    parser.add_argument(
        "--write", type=Path, metavar="FILE",
        help="write the rules file with the calibration's proposals (a detector's phi); never the live one",
    )  # fmt: skip


def cmd_backtest(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_backtest(args))
    except _Refused as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2


class _Refused(Exception):
    def __init__(self, *lines: str) -> None:
        self.lines = lines


def _period(args: argparse.Namespace, now: float) -> tuple[float, float]:
    from specguard.rules.durations import parse_duration

    try:
        end = parse_date(args.until, "--until") if args.until is not None else now
        try:
            length = parse_duration(args.since)
        except ValueError as exc:
            raise ValueError(f"--since: {exc}") from None
    except ValueError as exc:
        raise _Refused(f"{PROG}: {exc}") from None
    if length < 60:
        raise _Refused(f"{PROG}: --since: give at least a minute, not {args.since}")
    if length > MOST:
        raise _Refused(f"{PROG}: --since: at most 90d in one run, not {args.since}")
    if end > now + 60:
        raise _Refused(f"{PROG}: --until: {args.until} is in the future: nothing is recorded yet")
    return end - length, end


def _loaded(args: argparse.Namespace, rules: Path) -> Any:
    from specguard.config.loading import load

    overrides: dict[str, Any] = (
        {"state_dir": str(Path.cwd() / args.state_dir.expanduser())} if args.state_dir else {}
    )
    if args.from_prometheus:  # its rules are checked, raw PromQL among them, as on a Prometheus source
        overrides["sources"] = {"prometheus": {"url": args.from_prometheus}}
    if not rules.is_file():
        raise _Refused(f"{PROG}: {rules}: no such rules file")
    loaded = load(args.config, [str(rules)], overrides)
    if not loaded.ok:
        raise _Refused(*(str(p) for p in loaded.errors))
    if args.rule:
        known = {r.name for r in loaded.rules}
        unknown = [name for name in args.rule if name not in known]
        if unknown:
            raise _Refused(f"{PROG}: --rule: {rules} has no rule {', '.join(unknown)}")
    return loaded


async def _backtest(args: argparse.Namespace) -> int:
    from specguard.backtest.incidents import load as load_incidents
    from specguard.common.yamlfile import FileProblems

    start, end = _period(args, time.time())
    incidents = []
    if args.incidents is not None:
        try:
            incidents = load_incidents(args.incidents)
        except FileProblems as exc:
            raise _Refused(*(str(p) for p in exc.problems)) from None
    files = [args.rules] + ([args.compare] if args.compare is not None else [])
    loads = [(path, _loaded(args, path)) for path in files]
    for path in (args.html, args.write):
        if path is not None and not path.parent.is_dir():
            raise _Refused(f"{PROG}: {path}: no directory {path.parent} to write it in")
    if args.write is not None and args.write.resolve() in {p.resolve() for p in files}:
        raise _Refused(
            f"{PROG}: --write: {args.write} is a rules file being replayed: write the proposal elsewhere"
        )
    # The replay's events are the output, not log lines (the daemon's parts say them at info); the
    # level is put back after, for whatever runs next in this process.
    said = logging.getLogger("specguard")
    level = said.level
    said.setLevel(logging.WARNING)
    try:
        return await _replayed(args, loads, start, end, incidents)
    finally:
        said.setLevel(level)


async def _replayed(
    args: argparse.Namespace, loads: list[tuple[Path, Any]], start: float, end: float, incidents: list[Any]
) -> int:
    from specguard.backtest import calibrate, render
    from specguard.backtest.run import BacktestError, backtest

    runs = []
    for path, loaded in loads:
        prometheus = _prometheus(args, loaded)
        try:
            run = await backtest(loaded, start, end, tuple(args.rule or ()), prometheus, incidents)
        except BacktestError as exc:
            raise _Refused(f"{PROG}: {exc}") from None
        unread = _unread(run)
        if unread is not None:
            if prometheus is not None:
                await prometheus.close()
            raise _Refused(f"{PROG}: every evaluation failed: {unread}")
        try:
            await calibrate.calibrate(run, loaded)
        finally:
            if prometheus is not None:
                await prometheus.close()
        runs.append((str(path), run))
    try:
        if args.write is not None:
            said = calibrate.write(runs[0][1], args.rules, args.write)
            print(said, file=sys.stderr)
        if args.html is not None:
            from specguard.backtest.page import write_page

            write_page(args.html, runs)
    except OSError as exc:  # a directory it may not write in: said, as the other refusals are
        raise _Refused(f"{PROG}: cannot write {exc.filename or ''}: {exc.strerror or exc}") from None
    if args.json:
        sys.stdout.write(render.as_text_json(runs))
    else:
        sys.stdout.write(render.compared(runs) if len(runs) > 1 else render.text(runs[0][1], runs[0][0]))
    return 0


def _prometheus(args: argparse.Namespace, loaded: Any) -> Any:
    if args.from_prometheus is None:
        return None
    from specguard.backtest.prometheus_range import RangeSource

    config = loaded.config.sources.prometheus
    url = args.from_prometheus or (config.url if config is not None else None)
    if not url:
        raise _Refused(f"{PROG}: --from-prometheus: give the URL: the config has no sources.prometheus")
    timeout = config.timeout if config is not None else 30.0
    verify = config.verify_tls if config is not None else True
    return RangeSource(url, timeout, bearer_token=loaded.prometheus_token, verify_tls=verify)


def _unread(run: Any) -> str | None:
    """The source's error when not one evaluation of any rule could be read (Prometheus down): a
    backtest of nothing is not a result."""
    judged = [r.judged for r in run.rules if r.plan.skip is None]
    if not judged or any(j.evaluations == 0 or sum(j.errors.values()) < j.evaluations for j in judged):
        return None
    return str(next(iter(judged[0].errors)))
