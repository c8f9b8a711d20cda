"""The ``specguard`` command's entry point: the top parser, built from each command's own (a module
per command beside this one), and ``main``, which runs the command asked for."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from specguard import __version__
from specguard.cli import (
    backtest,
    backup,
    check,
    compat,
    demo,
    diagnose,
    export,
    fleet,
    history,
    ladder,
    preflight,
    report,
    routing,
    run,
    serve_config,
    signals,
    silence,
    simulate,
    status,
    tune,
)
from specguard.cli import eval as evaluate

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
  specguard compat /models/target /models/draft

With no --config (and no $SPECGUARD_CONFIG) specguard runs on defaults: it scrapes
http://127.0.0.1:8000/metrics, evaluates the shipped rule pack and logs what fires.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specguard",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parser(sub)
    check.add_parser(sub)
    evaluate.add_parser(sub)
    history.add_parser(sub)
    silence.add_parser(sub)
    demo.add_parser(sub)
    simulate.add_parser(sub)
    signals.add_parser(sub)
    export.add_parser(sub)
    status.add_parser(sub)
    ladder.add_parser(sub)
    report.add_parser(sub)
    backup.add_parser(sub)
    compat.add_parser(sub)
    diagnose.add_parser(sub)
    serve_config.add_parser(sub)
    from specguard.playbook.bench import cli as bench_cli

    bench_cli.add_parser(sub)
    tune.add_parser(sub)
    routing.add_parser(sub)
    preflight.add_parser(sub)
    fleet.add_parser(sub)
    backtest.add_parser(sub)
    return parser


# The function each command runs (`simulate` is run before parsing, on the simulator's own parser;
# `bench` by the bench's own module).
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run.cmd_run,
    "check": check.cmd_check,
    "eval": evaluate.cmd_eval,
    "signals": signals.cmd_signals,
    "history": history.cmd_history,
    "silence": silence.cmd_silence,
    "export": export.cmd_export,
    "status": status.cmd_status,
    "ladder": ladder.cmd_ladder,
    "report": report.cmd_report,
    "backup": backup.cmd_backup,
    "compat": compat.cmd_compat,
    "diagnose": diagnose.cmd_diagnose,
    "demo": demo.cmd_demo,
    "serve-config": serve_config.cmd_serve_config,
    "tune": tune.cmd_tune,
    "routing": routing.cmd_routing,
    "preflight": preflight.cmd_preflight,
    "fleet": fleet.cmd_fleet,
    "backtest": backtest.cmd_backtest,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # its options belong to the simulator's own parser, --help included
        return simulate.cmd_simulate(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
        if args.command == "bench":
            from specguard.playbook.bench import cli as bench_cli

            return bench_cli.cmd_bench(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    parser.error(f"unknown command {args.command}")
    return 2
