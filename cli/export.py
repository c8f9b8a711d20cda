"""``specguard export``: the rules as a Prometheus alerting-rule file, or the Alertmanager config
that delivers alerts to specguard's webhook."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specguard import __version__
from specguard.cli.shared.options import add_config
from specguard.cli.shared.printing import print_problems


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


def add_parser(sub: Any) -> None:
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
    add_config(rules)
    rules.add_argument("--output", "-o", type=Path, metavar="FILE", help="write here (default: stdout)")
    receiver = what.add_parser(
        "alertmanager-receiver",
        help="an Alertmanager config (route and receiver) that sends alerts to specguard's webhook",
        description="Print a complete Alertmanager config whose receiver posts to this config's "
        "webhook (server.listen, server.port, server.webhook_path) with a bearer token file.",
    )
    add_config(receiver)
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
        print_problems(loaded)
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
