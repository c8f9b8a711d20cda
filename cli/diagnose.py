"""``specguard diagnose``: the playbook's four troubleshooting cases answered from the host's
numbers (``playbook/diagnose``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from specguard.cli.shared.options import add_config, parse_date

PROG = "specguard diagnose"
SCRAPE_MOST = 3600.0  # a live window longer than this belongs in history

DESCRIPTION = """\
Answer the playbook's four troubleshooting cases with a verdict each (fine, suspect, cause found,
or unknown when the data is not there, never fine for want of it), the numbers it rests on and
the remedy:
  1. slower since speculation was enabled: acceptance (vLLM's rate and the k-invariant alpha-hat)
     against 0.3 / 0.5, the draft's cost c, the estimated speedup MAL / (1 + k c), KV-cache usage
     and preemptions; the cause (acceptance, draft cost, KV pressure) and the step (change the
     draft, lower k with the k table, fall back);
  2. acceptance collapses on some prompts only: acceptance per traffic class; the routing rule;
  3. bursty streaming: tokens per chunk, ITL per chunk and per token, the burst the mean
     acceptance length predicts; the client-side smoothing interval;
  4. vocabulary mismatch at start-up: vLLM's journal or log, and compat on the serving file's pair.

The window's numbers come from the state database's history (default), from Prometheus
(--prometheus) or from scraping the config's targets now (--scrape 60s).

Exit status: 0 every case fine; 1 a case found a cause or is suspect; 3 no cause found but a case
could not be judged (unknown); 2 input that cannot be used (a bad option, config or file).
"""

EPILOG = """\
examples:
  specguard diagnose --config /etc/specguard/specguard.yaml
  specguard diagnose --since 6h --case 1 3
  specguard diagnose --scrape 60s --json
  specguard diagnose --prometheus --since 2h --until 2026-12-05T10:00
  specguard diagnose --bench bench.json --case 2 3
  specguard diagnose --unit vllm.service --case 4
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "diagnose",
        help="the playbook's troubleshooting cases: verdicts, the numbers and the remedy",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(parser)
    parser.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    parser.add_argument(
        "--since", metavar="DURATION", help="the window up to --until, e.g. 1h (the default), 30m, 1d"
    )
    parser.add_argument(
        "--until", metavar="DATE", help="the window's end, UTC: 2026-12-05T10:00 (default: now)"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--scrape", metavar="DURATION",
        help="scrape the config's vLLM targets now for this long (e.g. 60s, at most 1h) instead of reading history",
    )  # fmt: skip
    source.add_argument(
        "--prometheus", metavar="URL", nargs="?", const="",
        help="read the window from Prometheus: the config's sources.prometheus, or this URL",
    )  # fmt: skip
    parser.add_argument(
        "--bench", type=Path, metavar="FILE", help="a `specguard bench --json` result (cases 2 and 3)"
    )
    parser.add_argument("--unit", metavar="UNIT", help="vLLM's systemd unit, whose journal case 4 reads "
                        "(default: the unit the config's vllm_restart action restarts, when it has one)")  # fmt: skip
    parser.add_argument(
        "--log", type=Path, metavar="FILE", help="vLLM's log file, for case 4 (instead of --unit)"
    )
    parser.add_argument("--case", type=int, nargs="+", choices=(1, 2, 3, 4), metavar="N",
                        help="only these cases (1-4; default: all)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def window(args: argparse.Namespace, now: float) -> tuple[float, float, float | None]:
    """(start, end, seconds to scrape or None); ValueError naming the option when wrong."""
    from specguard.rules.durations import parse_duration

    if args.scrape is not None:
        if args.since is not None or args.until is not None:
            raise ValueError("--scrape: a live window starts now: leave out --since and --until")
        try:
            seconds = parse_duration(args.scrape)
        except ValueError as exc:
            raise ValueError(f"--scrape: {exc}") from None
        if not 10 <= seconds <= SCRAPE_MOST:
            raise ValueError(f"--scrape: give 10s to 1h, not {args.scrape}")
        return now, now + seconds, seconds
    end = parse_date(args.until, "--until") if args.until is not None else now
    try:
        span = parse_duration(args.since or "1h")
    except ValueError as exc:
        raise ValueError(f"--since: {exc}") from None
    if span <= 0:
        raise ValueError("--since: the window is empty")
    return end - span, end, None


def cmd_diagnose(args: argparse.Namespace) -> int:
    from specguard.cli.shared.printing import print_problems
    from specguard.config.loading import load
    from specguard.playbook.diagnose import render
    from specguard.playbook.diagnose.gather import GatherError, gather
    from specguard.playbook.diagnose.run import diagnose, exit_code

    try:
        start, end, seconds = window(args, time.time())
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.log is not None and args.unit is not None:
        print(f"{PROG}: --log and --unit: give one", file=sys.stderr)
        return 2
    overrides = {"state_dir": str(Path.cwd() / args.state_dir.expanduser())} if args.state_dir else {}
    loaded = load(args.config, (), overrides)
    if not loaded.ok:
        print_problems(loaded)
        return 2
    source = "scrape" if seconds is not None else "prometheus" if args.prometheus is not None else "history"
    unit = args.unit if args.unit is not None or args.log is not None else restart_unit(loaded)

    async def work() -> tuple[Any, list[Any]]:
        evidence = await gather(
            loaded, start, end, source=source, scrape_seconds=seconds, bench=args.bench, unit=unit,
            log_file=args.log, prometheus_url=args.prometheus or None,
        )  # fmt: skip
        return evidence, await diagnose(evidence, args.case or (1, 2, 3, 4))

    try:
        evidence, findings = asyncio.run(work())
    except GatherError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    code = exit_code(findings)
    sys.stdout.write(
        render.as_json(evidence, findings, code) if args.json else render.text(evidence, findings)
    )
    return code


def restart_unit(loaded: Any) -> str | None:
    """The systemd unit the config's vllm_restart actions restart, when there is exactly one: the
    vLLM whose journal case 4 reads unless --unit or --log says otherwise."""
    from specguard.actions.vllm_restart import VllmRestartParams

    units = {
        action.params.unit
        for action in loaded.actions.values()
        if isinstance(action.params, VllmRestartParams) and action.params.unit is not None
    }
    return units.pop() if len(units) == 1 else None
