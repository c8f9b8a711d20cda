"""``specguard eval``: a fresh reading, every rule evaluated once now, printed as a table or JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from specguard.cli import reading, unread
from specguard.cli.shared import detectors, rulenames
from specguard.cli.shared.options import add_config, add_source_overrides, overrides
from specguard.cli.shared.printing import print_columns, print_problems
from specguard.daemon.statusview import detector_line


def add_parser(sub: Any) -> None:
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
    add_config(ev)
    add_source_overrides(ev)
    ev.add_argument("--once", action="store_true", help="evaluate once (the only mode; kept explicit)")
    ev.add_argument("--sample-gap", type=float, default=5.0, metavar="SECONDS", help="default 5")
    reading.add_arguments(ev)
    ev.add_argument("--format", choices=["table", "json"], default="table", help="default table")
    ev.add_argument("--rule", action="append", metavar="NAME", help="only this rule (repeatable)")
    ev.add_argument(
        "--alerts",
        type=Path,
        metavar="FILE",
        help="an Alertmanager webhook body (JSON, version 4) to evaluate as if it had just arrived: "
        "alert rules read its alerts, signal rules it triggers show it as their trigger",
    )


def cmd_eval(args: argparse.Namespace) -> int:
    from specguard.config.loading import load

    loaded = load(args.config, (), overrides(args))
    if not loaded.ok:
        print_problems(loaded)
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
    sampling = reading.plan(loaded, only, args.sample_gap, args.window_from_rule)
    kind = "prometheus" if loaded.config.sources.prometheus is not None else "scrape"
    reading.announce(sampling, kind, lambda line: print(line, file=sys.stderr))
    failures: list[str] = []
    rows, sampled = asyncio.run(_evaluate_once(loaded, sampling, only, alerts, failures))
    what = reading.what_it_is(sampling, kind, sampled)
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
    sampling: reading.Sampling,
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
    stored = detectors.stored_states(loaded) if any(i.rule.detect for i in loaded.enabled_rules()) else {}
    try:
        sampled = await reading.sample(source, sampling)
        now = time.time()
        for item in loaded.enabled_rules():
            if only and item.name not in only:
                continue
            interval = item.every(loaded.config.interval)
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
            base["over"] = reading.over(window, sampled)[0]
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
        row["note"] = reading.note(row, row["window"], sampled, scraped)
    return rows, sampled


def _number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


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
                reading.over(row["window"], row["over"])[1],
                row["trigger"].split(":", 1)[0],
            )
        )
    print_columns(table)
    notes = reading.notes_line(rows)
    if notes is not None:
        print(notes)
    for row in rows:
        detector = row.get("detector")
        if detector:
            print(f"{row['rule']}: {detector_line(detector)}")
    for row in rows:
        if row.get("error"):
            print(f"{row['rule']}: {row['error']}", file=sys.stderr)
