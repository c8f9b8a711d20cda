"""The ``specguard`` command line: the parser, and the commands small enough to live here (the
larger ones have a module each beside it)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specguard import __version__
from specguard.cli import backup as cli_backup
from specguard.cli import detectors as cli_detectors
from specguard.cli import ladder as cli_ladder
from specguard.cli import reading as cli_reading
from specguard.cli import report as cli_report
from specguard.cli import rulenames, unread
from specguard.cli import silence as cli_silence
from specguard.cli import status as cli_status
from specguard.daemon.statusview import detector_line

DESCRIPTION = """\
specguard watches speculative decoding on vLLM: it evaluates YAML rules over vLLM's metrics
(acceptance, latency against a baseline, KV-cache pressure...) and acts when they fire.
"""

EPILOG = """\
examples:
  specguard check --config /etc/specguard/specguard.yaml
  specguard eval --once --scrape http://127.0.0.1:8000/metrics
  specguard run --config /etc/specguard/specguard.yaml
  specguard status --config /etc/specguard/specguard.yaml
  specguard signals
  specguard history --config /etc/specguard/specguard.yaml --rule acceptance_low

With no --config (and no $SPECGUARD_CONFIG) specguard runs on defaults: it scrapes
http://127.0.0.1:8000/metrics, evaluates the shipped rule pack and logs what fires.
"""


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        "-c",
        type=Path,
        default=os.environ.get("SPECGUARD_CONFIG") or None,
        help="specguard.yaml (default: $SPECGUARD_CONFIG, else built-in defaults)",
    )


def _add_source_overrides(parser: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specguard",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run the daemon: evaluate rules on a schedule and act",
        description="Run the daemon in the foreground (systemd runs it this way). "
        "SIGHUP reloads the config (an invalid one is refused and the old one kept); "
        "SIGTERM/SIGINT stop it cleanly.",
    )
    _add_config(run)
    _add_source_overrides(run)
    run.add_argument("--listen", metavar="HOST", help="address of the HTTP server (default 127.0.0.1)")
    run.add_argument("--port", type=int, metavar="N", help="port of the HTTP server (default 9464)")
    run.add_argument(
        "--webhook-token-file",
        type=Path,
        metavar="FILE",
        help="bearer token Alertmanager must send to the webhook (server.webhook_token_file)",
    )
    run.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    run.add_argument(
        "--dry-run", action="store_true", default=None, help="evaluate and record, run no action"
    )
    run.add_argument("--log-format", choices=["auto", "json", "text"], help="log format (default: auto)")

    check = sub.add_parser(
        "check",
        help="validate the config and rule files",
        description="Validate the config, its rule files, baseline and actions, like `promtool check "
        "rules`. Prints every problem at once as file:line: field: message, and warnings (an action no "
        "rule names, a rule that will report an error for want of a baseline or a draft cost). "
        "Exit 0 when valid (warnings or not), 1 otherwise.",
    )
    _add_config(check)
    check.add_argument(
        "rule_files",
        nargs="*",
        metavar="RULE_FILE",
        help="check these rule files instead of the config's",
    )

    ev = sub.add_parser(
        "eval",
        help="a fresh reading: evaluate every rule once now and print the result",
        description="Evaluate every enabled rule once and print value, threshold and state per series. "
        "On a scrape source it takes two scrapes --sample-gap seconds apart, so rates exist, and each "
        "rule's value is over that gap only (--window-from-rule: over the rule's own window). "
        "States are computed from scratch: a breach with `for` shows as pending. This is a fresh "
        "reading, not the daemon's view: `specguard status` shows what the running daemon sees. "
        "Exit 0 when every source was read; 1 when the config has errors, or a target or "
        "Prometheus could not be read (the table is printed all the same); 2 when a --rule names "
        "no enabled rule of the config.",
    )
    _add_config(ev)
    _add_source_overrides(ev)
    ev.add_argument("--once", action="store_true", help="evaluate once (the only mode; kept explicit)")
    ev.add_argument("--sample-gap", type=float, default=5.0, metavar="SECONDS", help="default 5")
    cli_reading.add_arguments(ev)
    ev.add_argument("--format", choices=["table", "json"], default="table", help="default table")
    ev.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    ev.add_argument(
        "--alerts",
        type=Path,
        metavar="FILE",
        help="an Alertmanager webhook body (JSON, version 4) to evaluate as if it had just arrived: "
        "alert rules read its alerts, signal rules it triggers show it as their trigger",
    )

    history = sub.add_parser(
        "history",
        help="what the rules did: state changes, their trigger and their action runs",
        description="List the latest state changes recorded in the state database, newest first: "
        "when, which rule and series, what triggered the evaluation (the schedule or an "
        "Alertmanager delivery), how each action run ended, and under each change what it said "
        "(the rule's message for that transition) and what its actions did later. Reads the database of the config's "
        "state_dir (or --state-dir); the daemon may be running.",
    )
    _add_config(history)
    history.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    history.add_argument(
        "--rule",
        metavar="NAME",
        help="only this rule (of the config, or recorded in the database; else exit 2)",
    )
    history.add_argument("--since", metavar="DURATION", help="only changes this recent, e.g. 24h")
    history.add_argument("--limit", type=int, default=50, metavar="N", help="how many changes (default 50)")
    history.add_argument("--format", choices=["table", "json"], default="table", help="default table")

    _add_silence(sub)

    demo = sub.add_parser(
        "demo",
        help="see specguard work end to end against a simulated vLLM (about a minute)",
        description="Start a simulated vLLM with speculative decoding, a standard-decoding one, a router "
        "that follows a flag file, a Slack Web API on loopback and the specguard daemon; drive traffic, "
        "then degrade acceptance: the fallback rule fires, the flag moves traffic to standard decoding, "
        "on-call gets a Slack thread, and once acceptance is back (a canary says so) the flag is "
        "restored. Finishes by itself in about 45 s; Ctrl-C stops it.",
    )
    demo.add_argument("--no-color", dest="color", action="store_false", default=None, help="plain text")
    demo.add_argument("--color", dest="color", action="store_true", help="colour even when not a terminal")
    demo.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the demo's state, log and config go (default: a new temp dir)",
    )

    sub.add_parser(
        "simulate",
        add_help=False,
        help="run a vLLM-compatible simulator (OpenAI API + /metrics); see `specguard simulate --help`",
    ).add_argument("simulator_args", nargs=argparse.REMAINDER)

    signals = sub.add_parser(
        "signals",
        help="list the signal catalog with the PromQL each signal uses",
        description="List every signal rules can name, its unit, the vLLM metrics it reads (with "
        "the vLLM versions of each name) and the PromQL the Prometheus source runs.",
    )
    signals.add_argument("--window", default="5m", help="window used in the PromQL shown (default 5m)")
    signals.add_argument("--format", choices=["table", "json"], default="table")
    _add_export(sub)
    cli_status.add_parser(sub, _add_config)
    cli_ladder.add_parser(sub, _add_config)
    cli_report.add_parser(sub, _add_config)
    cli_backup.add_parser(sub, _add_config)
    from specguard.playbook.bench import cli as bench_cli

    bench_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # its options belong to the simulator's own parser, --help included
        return cmd_simulate(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "check":
            return cmd_check(args)
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "signals":
            return cmd_signals(args)
        if args.command == "history":
            return cmd_history(args)
        if args.command == "silence":
            return cli_silence.cmd_silence(args, _state_database, _print_columns)
        if args.command == "export":
            return cmd_export(args)
        if args.command == "status":
            return cli_status.cmd_status(args)
        if args.command == "ladder":
            return cli_ladder.cmd_ladder(args)
        if args.command == "report":
            return cli_report.cmd_report(args, _state_database)
        if args.command == "backup":
            return cli_backup.cmd_backup(args, _state_database)
        if args.command == "bench":
            from specguard.playbook.bench import cli as bench_cli

            return bench_cli.cmd_bench(args)
        if args.command == "demo":
            from specguard.demo.run import main as demo_main

            return demo_main(args.state_dir, args.color)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
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


def _print_problems(loaded: Any) -> None:
    for problem in sorted(loaded.problems, key=lambda p: (p.file, p.line or 0)):
        print(problem, file=sys.stderr)


def _config_data(path: Path | None) -> Any:
    """The config file's YAML with its line numbers, for messages (None when it cannot be read)."""
    from specguard.common.yamlfile import FileProblems, load_yaml

    if path is None:
        return None
    try:
        return load_yaml(path)
    except FileProblems:
        return None


def cmd_check(args: argparse.Namespace) -> int:
    from specguard.config.loading import check_state_dir, load

    loaded = load(args.config, args.rule_files)
    state = check_state_dir(loaded, _config_data(args.config))
    if state is not None:
        loaded.problems.append(state)
    _print_problems(loaded)
    if not loaded.ok:
        print(f"{len(loaded.errors)} error(s)", file=sys.stderr)
        return 1
    files = len({r.file for r in loaded.rules})
    print(f"OK: {len(loaded.rules)} rules in {files} file(s), {len(loaded.actions)} action(s)")
    if loaded.baseline is not None:
        _print_baseline_use(loaded)
    cli_detectors.print_detectors(loaded)
    return 0


def _print_baseline_use(loaded: Any) -> None:
    """Which baseline entries each rule that reads the baseline would use, per model."""
    baseline = loaded.baseline
    count = len(baseline.entries)
    print(
        f"baseline {loaded.config.baseline} (version {baseline.version}, {count} entr{'y' if count == 1 else 'ies'}):"
    )
    for item in loaded.rules:
        rule = item.rule
        wanted = rule.test.baseline_signal if rule.test is not None else None
        if wanted is None and rule.signal != "estimated_speedup":
            continue
        uses = []
        for entry in baseline.entries:
            who = entry.describe().removeprefix("the baseline entry for ").removeprefix("the ")
            if wanted is not None:
                value = entry.signals.get(wanted)
                shown = f"{wanted} = {value:.4g}" if value is not None else f"no {wanted}"
            else:
                cost = entry.speculative.cost() if entry.speculative is not None else "no speculative method"
                shown = f"draft cost c = {cost:g}" if isinstance(cost, float) else "no draft cost"
            when = f", measured {entry.measured_at:%Y-%m-%d}" if entry.measured_at else ""
            uses.append(f"{who}: {shown}{when}")
        print(f"  {rule.name}: " + "; ".join(uses))


def cmd_run(args: argparse.Namespace) -> int:
    from specguard.common import logs
    from specguard.config.loading import load

    overrides = _overrides(args)
    loaded = load(args.config, (), overrides)
    logs.setup(loaded.config.log_format, loaded.config.log_level)
    if not loaded.ok:
        _print_problems(loaded)
        print("specguard: not starting: the configuration has errors", file=sys.stderr)
        return 1
    for problem in loaded.warnings:
        print(problem, file=sys.stderr)
    from specguard.daemon.runtime import Daemon
    from specguard.report import weekly

    daemon = Daemon(loaded, args.config, (), overrides, reports=weekly)
    # What start-up built (modules, the configuration, the rules) lives as long as the process:
    # moved out of the cycle collector's sight, its full collections stop walking it, and the
    # pauses they make every request wait behind stay short.
    gc.freeze()
    asyncio.run(daemon.run_until_stopped())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from specguard.config.loading import load

    loaded = load(args.config, (), _overrides(args))
    if not loaded.ok:
        _print_problems(loaded)
        return 1
    mistake = rulenames.eval_mistake(loaded, args.rule or ())
    if mistake is not None:
        print(f"specguard eval: {mistake}", file=sys.stderr)
        return rulenames.USAGE
    alerts = None
    if args.alerts is not None:
        try:
            alerts = _read_alerts(args.alerts)
        except ValueError as exc:
            print(f"specguard eval: {exc}", file=sys.stderr)
            return 1
    only = set(args.rule or ())
    sampling = cli_reading.plan(loaded, only, args.sample_gap, args.window_from_rule)
    kind = "prometheus" if loaded.config.sources.prometheus is not None else "scrape"
    cli_reading.announce(sampling, kind, lambda line: print(line, file=sys.stderr))
    failures: list[str] = []
    rows, sampled = asyncio.run(_evaluate_once(loaded, sampling, only, alerts, failures))
    what = cli_reading.what_it_is(sampling, kind, sampled)
    if args.format == "json":
        print(what, file=sys.stderr)  # stdout stays one JSON array
        print(json.dumps(rows, indent=2))
    else:
        print(what)
        print()
        _print_table(rows)
    if failures:
        print(unread.message(loaded, failures), file=sys.stderr)
        return 1
    return 0


def _read_alerts(path: Path) -> Any:
    """The alerts of a saved webhook body, as the daemon's alert book would hold them."""
    from specguard.daemon.alertmanager.book import AlertBook, Receipt
    from specguard.daemon.alertmanager.payload import BadPayload, parse

    try:
        body = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"--alerts {path}: cannot read it ({exc.strerror})") from None
    try:
        message = parse(body)
    except BadPayload as exc:
        raise ValueError(f"--alerts {path}: not an Alertmanager webhook body: {exc}") from None
    book = AlertBook()
    for index, alert in enumerate(message.alerts):
        book.update(
            Receipt(
                index,
                0,
                alert.fingerprint,
                alert.status.value,
                alert.starts,
                alert.ends_at.isoformat() if alert.ends_at else None,
                dict(alert.labels),
                dict(alert.annotations),
                time.time(),
            )
        )
    return book


def _trigger_of(item: Any, alerts: Any) -> str:
    """What would evaluate the rule now: the alerts given, when they concern it, or the schedule."""
    from specguard.daemon.alertmanager.book import trigger_of

    concerned = [
        r for r in (alerts.alerts.values() if alerts else ()) if item.rule.takes_alert(r.labels, r.status)
    ]
    return trigger_of(concerned, "--alerts") if concerned else "schedule"


async def _evaluate_once(
    loaded: Any,
    sampling: cli_reading.Sampling,
    only: set[str],
    alerts: Any = None,
    failures: list[str] | None = None,
) -> tuple[list[dict[str, Any]], float | None]:
    """The rows, and the seconds the scrapes spanned (None: Prometheus, over each whole window);
    what the source could not read goes to ``failures``."""
    from specguard.daemon.evaluation import evaluate_rule, window_of
    from specguard.daemon.status import detector_row
    from specguard.daemon.wiring import make_source

    source = make_source(loaded)
    rows: list[dict[str, Any]] = []
    stored = cli_detectors.stored_states(loaded) if any(i.rule.detect for i in loaded.enabled_rules()) else {}
    try:
        sampled = await cli_reading.sample(source, sampling)
        now = time.time()
        for item in loaded.enabled_rules():
            if only and item.name not in only:
                continue
            interval = item.rule.interval or loaded.config.interval
            trigger = _trigger_of(item, alerts)
            # A detector steps on from the daemon's own state (its calibration and evidence), read
            # from the state database without writing it; every other rule starts from scratch.
            previous = stored.get(item.name, {}) if item.rule.detect is not None else {}
            outcome, result = await evaluate_rule(
                item, source, loaded.baseline, previous, now, interval, alerts=alerts, trigger=trigger
            )
            what = item.rule.signal or item.rule.expr or "alerts"
            window = None if item.rule.alert_only else window_of(item, loaded.config.interval)
            base = {"rule": item.name, "signal": what, "trigger": trigger, "window": window}
            base["over"] = cli_reading.over(window, sampled)[0]
            if not outcome.states:
                verdict = "error" if outcome.error else "warming_up" if result.warming else "no_data"
                warming = ", ".join(sorted(result.warming))
                rows.append(
                    {
                        **base,
                        "labels": {},
                        "value": None,
                        "threshold": None,
                        "state": "inactive",
                        "verdict": verdict,
                        "error": outcome.error or (f"warming up: {warming}" if warming else None),
                    }
                )
            for key, series in outcome.states.items():
                rows.append(
                    {
                        **base,
                        "labels": dict(series.labels),
                        "value": series.value,
                        "threshold": series.threshold,
                        "state": series.state.value,
                        "verdict": outcome.verdicts[key].value,
                        "error": series.error,
                        **detector_row(item.rule.detect, series, interval),
                    }
                )
        evaluated = [i for i in loaded.enabled_rules() if not only or i.name in only]
        if failures is not None and not all(i.rule.alert_only for i in evaluated):  # the source was read
            failures.extend(await unread.unread(source))
    finally:
        await source.close()
    scraped = not getattr(source, "last_errors", None)  # else the failed scrapes are the likelier reason
    for row in rows:
        row["note"] = cli_reading.note(row, row["window"], sampled, scraped)
    return rows, sampled


def _number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


def _print_columns(table: Sequence[Sequence[str]], below: Mapping[int, Sequence[str]] | None = None) -> None:
    """Rows of cells in aligned columns, the first row the header; ``below[i]``: lines printed
    under row i, from the second column on."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for index, row in enumerate(table):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        for line in (below or {}).get(index, ()):
            print(" " * (widths[0] + 2) + line)


def _print_table(rows: list[dict[str, Any]]) -> None:
    header = ("RULE", "SIGNAL", "LABELS", "VALUE", "THRESHOLD", "VERDICT", "STATE", "OVER", "TRIGGER")
    table = [header]
    for row in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(row["labels"].items())) or "-"
        table.append(
            (
                row["rule"],
                str(row["signal"]),
                labels,
                _number(row["value"]),
                _number(row["threshold"]),
                row["verdict"],
                row["state"],
                cli_reading.over(row["window"], row["over"])[1],
                row["trigger"].split(":", 1)[0],
            )
        )
    _print_columns(table)
    notes = cli_reading.notes_line(rows)
    if notes is not None:
        print(notes)
    for row in rows:
        detector = row.get("detector")
        if detector:
            print(f"{row['rule']}: {detector_line(detector)}")
    for row in rows:
        if row.get("error"):
            print(f"{row['rule']}: {row['error']}", file=sys.stderr)


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


def _state_database(
    args: argparse.Namespace, command: str, loaded_out: list[Any] | None = None
) -> Path | None:
    """The state database of the config's state_dir (or --state-dir); None, said, when there is
    none or the config is wrong. The loaded config goes to ``loaded_out``."""
    from specguard.config.loading import load
    from specguard.daemon.wiring import STORE_FILE

    overrides = {"state_dir": str(Path.cwd() / args.state_dir.expanduser())} if args.state_dir else {}
    loaded = load(args.config, (), overrides)
    if not loaded.ok:
        _print_problems(loaded)
        return None
    if loaded_out is not None:
        loaded_out.append(loaded)
    path = loaded.config.resolved_state_dir() / STORE_FILE
    if not path.is_file():
        print(
            f"specguard {command}: no state database at {path}: the daemon has not run with this "
            "state_dir (give --config or --state-dir)",
            file=sys.stderr,
        )
        return None
    return path


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
    loaded: list[Any] = []
    path = _state_database(args, "history", loaded)
    if path is None:
        return 1

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
    _print_columns(table, below)
    return 0


def cmd_simulate(argv: Sequence[str]) -> int:
    # The simulator has its own parser, loaded only here: the daemon never imports it.
    from specguard.sim import cli as sim_cli

    parser = argparse.ArgumentParser(
        prog="specguard simulate",
        description=sim_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim_cli.add_arguments(parser)
    return sim_cli.run(sim_cli.parse_args(parser, argv))


def cmd_signals(args: argparse.Namespace) -> int:
    from specguard.rules.durations import parse_duration
    from specguard.rules.signals import CATALOG, DEFAULT_GROUP_BY, Kind

    try:
        window = parse_duration(args.window)
    except ValueError as exc:
        print(f"specguard signals: --window: {exc}", file=sys.stderr)
        return 2
    items: list[dict[str, Any]] = []
    for signal in CATALOG.values():
        parts = [CATALOG[name] for name in signal.inputs] or [signal]
        metrics = [m for part in parts for m in (part.metric, part.denominator) if m is not None]
        if signal.kind is Kind.SPEEDUP:
            length, positions = (p.promql(window, DEFAULT_GROUP_BY) for p in parts)
            promql = f"({length}) / (1 + ({positions}) * c), c from the baseline per model"
        else:
            promql = signal.promql(window, DEFAULT_GROUP_BY)
        items.append(
            {
                "signal": signal.name,
                "unit": signal.unit,
                "description": signal.description,
                "metrics": [
                    {"name": name, "vllm": since}
                    for m in dict.fromkeys(metrics)
                    for name, since in zip(m.names, m.since, strict=True)
                ],
                "promql": promql,
            }
        )
    if args.format == "json":
        print(json.dumps(items, indent=2))
        return 0
    for item in items:
        print(f"{item['signal']}  ({item['unit']})")
        print(f"  {item['description']}")
        for metric in item["metrics"]:
            print(f"  metric: {metric['name']}  [vLLM {metric['vllm']}]")
        print(f"  promql: {item['promql']}")
        print()
    return 0


# --- specguard export -----------------------------------------------------------------------------


def _duration_arg(text: str) -> float:
    from specguard.rules.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _url_arg(text: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL")
    return text


def _add_export(sub: Any) -> None:
    export = sub.add_parser(
        "export",
        help="write Prometheus alerting rules, or the Alertmanager config for specguard's webhook",
        description="Write what the Prometheus stack beside specguard needs: the rules as a Prometheus "
        "alerting-rule file, or the Alertmanager route and receiver that deliver alerts to specguard.",
    )
    what = export.add_subparsers(dest="export_command", metavar="WHAT", required=True)
    rules = what.add_parser(
        "prometheus-rules",
        help="the rules as a Prometheus alerting-rule file (promtool check rules accepts it)",
        description="Write every enabled rule with a signal or an expr as Prometheus alerting rules, "
        "grouped by evaluation interval. Baseline thresholds are written as numbers, one rule per "
        "baseline entry. What Prometheus cannot do is said in comments and warnings (stderr).",
    )
    _add_config(rules)
    rules.add_argument("--output", "-o", type=Path, metavar="FILE", help="write here (default: stdout)")
    receiver = what.add_parser(
        "alertmanager-receiver",
        help="an Alertmanager config (route and receiver) that sends alerts to specguard's webhook",
        description="Print a complete Alertmanager config whose receiver posts to this config's "
        "webhook (server.listen, server.port, server.webhook_path) with a bearer token file.",
    )
    _add_config(receiver)
    receiver.add_argument(
        "--credentials-file",
        metavar="PATH",
        help="the token file on the Alertmanager host (default /etc/alertmanager/specguard-token)",
    )
    receiver.add_argument("--url", type=_url_arg, help="the webhook URL (default: from the config)")
    receiver.add_argument("--group-wait", type=_duration_arg, default=30.0, metavar="D", help="default 30s")
    receiver.add_argument(
        "--group-interval", type=_duration_arg, default=300.0, metavar="D", help="default 5m"
    )
    receiver.add_argument(
        "--repeat-interval", type=_duration_arg, default=14400.0, metavar="D", help="default 4h"
    )
    receiver.add_argument(
        "--timeout",
        type=_duration_arg,
        metavar="D",
        help="the webhook's timeout (Alertmanager 0.28 and later; older versions refuse the key)",
    )


def cmd_export(args: argparse.Namespace) -> int:
    from specguard.config.loading import load

    loaded = load(args.config)
    if not loaded.ok:
        _print_problems(loaded)
        print("specguard export: nothing written: the configuration has errors", file=sys.stderr)
        return 1
    # The loader's warnings are `specguard check`'s business; what they mean for the export (a rule
    # left out for want of a baseline) is said by the export itself.
    if args.export_command == "prometheus-rules":
        return _export_rules(loaded, args.output)
    return _export_receiver(loaded, args)


def _export_rules(loaded: Any, output: Path | None) -> int:
    from specguard.common.files import write_atomically
    from specguard.export.prometheus_rules import export_rules

    result = export_rules(loaded, __version__)
    for warning in result.warnings:
        print(f"specguard export: warning: {warning}", file=sys.stderr)
    if output is None:
        sys.stdout.write(result.text)
        return 0
    try:
        write_atomically(output, result.text, keep_previous=False)  # a rules glob would load a .prev
    except OSError as exc:
        print(f"specguard export: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {result.alerting_rules} alerting rule(s), from {len(result.exported)} specguard rule(s), "
        f"to {output}",
        file=sys.stderr,
    )
    return 0


def _export_receiver(loaded: Any, args: argparse.Namespace) -> int:
    from specguard.export.alertmanager import DEFAULT_CREDENTIALS_FILE, export_receiver

    try:
        result = export_receiver(
            loaded,
            __version__,
            credentials_file=args.credentials_file or DEFAULT_CREDENTIALS_FILE,
            url=args.url,
            group_wait=args.group_wait,
            group_interval=args.group_interval,
            repeat_interval=args.repeat_interval,
            timeout=args.timeout,
        )
    except ValueError as exc:
        print(f"specguard export alertmanager-receiver: {exc}", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"specguard export: warning: {warning}", file=sys.stderr)
    sys.stdout.write(result.text)
    return 0


def _add_silence(sub: Any) -> None:
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
    add.add_argument("--author", help="who (default: $SUDO_USER or $USER)")
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
        _add_config(verb)
        verb.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
