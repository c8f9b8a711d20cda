"""``specguard preflight``: the playbook's pre-deploy checklist on this host, each item pass, fail or
unknown with its evidence and the command that fixes it; a table, ``--json``, and ``--out`` a
Markdown record for the change ticket. The checks live in ``preflight/``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specguard.cli.shared.options import add_config

DESCRIPTION = """\
Check this host against the playbook's deploy checklist, item by item: 1 the baseline is measured,
fresh and of the running model and vLLM version; 2 `specguard compat` passes for the serving file's
target and draft; 3 k was tuned (`specguard tune` recorded a result) and the running k is the
recommended one or within its margin; 4 acceptance on production traffic is over 0.55; 5 speculation
pays, over 1.3x (measured by `bench --against`, and estimated from production traffic as
MAL / (1 + k c): each said for what it is, both must be over); 6 the KV cache stays under 95 % at peak with no preemption burst; 7 the fallback was drilled (--drill runs
the drill: the flag engaged through the configured action, traffic seen moving, restored through the
canary, recorded); 8 the routing config renders and `nginx -t` passes; 9 Prometheus scrapes vLLM and
specguard, holds the exported rules, and the Grafana dashboard is current; 10 the weekly report is
scheduled and the last one written; 11 every rule with actions has a runbook link that resolves
(--notify-test posts a test message to Slack and deletes it).

Each item answers pass, fail or unknown (this host cannot tell: no state database, no serving file,
a model not here...), with the evidence it read and the command that fixes it. The numbers are the
playbook's unless the config's `preflight:` section says otherwise. Items 4-6 read the daemon's
history in the state database (the daemon may be running).
"""

EPILOG = """\
exit codes: 0 every item passed (or was unknown, with --allow unknown); 1 an item failed or was
unknown; 2 bad input (the config, a flag)
examples:
  specguard preflight --config /etc/specguard/specguard.yaml
  specguard preflight -c specguard.yaml --drill --notify-test --out preflight-CHG1234.md
  specguard preflight -c specguard.yaml --only baseline,compat,tuning --json
"""


# The items' keys, in order (preflight/items/__init__.py's ITEMS; a test holds the two together):
# named here so that building the parser imports none of the checks.
KEYS = ("baseline", "compat", "tuning", "acceptance", "speedup", "kv_cache", "drill", "routing",
        "prometheus", "report", "runbook")  # fmt: skip


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "preflight",
        help="the deploy checklist: each item pass/fail/unknown with its evidence and fix",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(parser)
    parser.add_argument("--drill", action="store_true",
                        help="item 7: run the fallback drill (engages the flag, sees traffic move, restores it)")  # fmt: skip
    parser.add_argument("--notify-test", action="store_true",
                        help="item 11: post a test message to the Slack channel and delete it")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the Markdown record to FILE")
    parser.add_argument("--allow", choices=["unknown"], action="append", default=[],
                        help="--allow unknown: exit 0 when items this host cannot check are unknown")  # fmt: skip
    parser.add_argument(
        "--only", metavar="KEY,...", help=f"only these items, comma-separated: {', '.join(KEYS)}"
    )


def _only(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [key for key in chosen if key not in KEYS]
    if unknown or not chosen:
        raise ValueError(
            f"--only {text!r}: no item {', '.join(unknown) or '(none given)'}; items are {', '.join(KEYS)}"
        )
    return chosen


def cmd_preflight(args: argparse.Namespace) -> int:
    import asyncio
    import socket
    import time

    from specguard import __version__
    from specguard.cli.shared.printing import print_problems
    from specguard.common.files import write_atomically
    from specguard.config.loading import load
    from specguard.preflight import render
    from specguard.preflight.item import Context
    from specguard.preflight.run import passed, run

    try:
        only = _only(args.only)
    except ValueError as exc:
        print(f"specguard preflight: {exc}", file=sys.stderr)
        return 2
    if args.out is not None and not args.out.parent.resolve().is_dir():
        print(f"specguard preflight: --out {args.out}: no such directory {args.out.parent}", file=sys.stderr)
        return 2
    loaded = load(args.config, (), {})
    if not loaded.ok:
        print_problems(loaded)
        return 2
    now = time.time()
    ctx = Context(loaded=loaded, config_file=args.config, store_file=loaded.config.store_file(), now=now,
                  drill=args.drill, notify_test=args.notify_test)  # fmt: skip
    results = asyncio.run(run(ctx, only))
    allow_unknown = "unknown" in args.allow
    ok = passed(results, allow_unknown)
    header = render.Header(
        socket.gethostname(), now, str(args.config or "<defaults>"), __version__, allow_unknown, only
    )
    if args.json:
        print(json.dumps(render.to_json(header, results, ok), indent=2))
    else:
        sys.stdout.write(render.table(header, results, ok))
    if args.out is not None:
        try:
            write_atomically(args.out, render.markdown(header, results, ok), keep_previous=False)
        except OSError as exc:
            print(
                f"specguard preflight: --out {args.out}: cannot write it: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        print(f"specguard preflight: record written to {args.out}", file=sys.stderr)
    return 0 if ok else 1
