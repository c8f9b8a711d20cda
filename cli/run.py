"""``specguard run``: the daemon in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from pathlib import Path
from typing import Any

from specguard.cli.shared import options
from specguard.cli.shared.printing import print_problems


def add_parser(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run the daemon: evaluate rules on a schedule and act",
        description="Run the daemon in the foreground (systemd runs it this way). "
        "SIGHUP reloads the config (an invalid one is refused and the old one kept); "
        "SIGTERM/SIGINT stop it cleanly.",
    )
    options.add_config(run)
    options.add_source_overrides(run)
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


def cmd_run(args: argparse.Namespace) -> int:
    from specguard.common import logs
    from specguard.config.loading import load

    overrides = options.overrides(args)
    loaded = load(args.config, (), overrides)
    logs.setup(loaded.config.log_format, loaded.config.log_level)
    if not loaded.ok:
        print_problems(loaded)
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
