"""``specguard signals``: the signal catalog, with the metrics and the PromQL of each signal."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    signals = sub.add_parser(
        "signals",
        help="list the signal catalog with the PromQL each signal uses",
        description="List every signal rules can name, its unit, the vLLM metrics it reads (with "
        "the vLLM versions of each name) and the PromQL the Prometheus source runs.",
    )
    signals.add_argument("--window", default="5m", help="window used in the PromQL shown (default 5m)")
    signals.add_argument("--format", choices=["table", "json"], default="table")


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
