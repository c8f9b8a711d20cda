"""``specguard check``: validate the config and its rule files, and say which baseline entries
and detectors the rules would use."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specguard.cli.shared import detectors
from specguard.cli.shared.options import add_config
from specguard.cli.shared.printing import print_problems


def add_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check",
        help="validate the config and rule files",
        description="Validate the config, its rule files, baseline and actions, like `promtool check "
        "rules`. Prints every problem at once as file:line: field: message, and warnings (an action no "
        "rule names, a rule that will report an error for want of a baseline or a draft cost). With a `routing:` "
        "section and nginx on the host, the rendered router is checked with `nginx -t`. "
        "Exit 0 when valid (warnings or not), 1 otherwise.",
    )
    add_config(check)
    check.add_argument(
        "rule_files",
        nargs="*",
        metavar="RULE_FILE",
        help="check these rule files instead of the config's",
    )


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
    print_problems(loaded)
    if not loaded.ok:
        print(f"{len(loaded.errors)} error(s)", file=sys.stderr)
        return 1
    files = len({r.file for r in loaded.rules})
    print(f"OK: {len(loaded.rules)} rules in {files} file(s), {len(loaded.actions)} action(s)")
    if loaded.baseline is not None:
        _print_baseline_use(loaded)
    detectors.print_detectors(loaded)
    return _check_routing(loaded)


def _check_routing(loaded: Any) -> int:
    """``nginx -t`` on the rendered router, when the config has ``routing:`` and nginx is here."""
    routing = loaded.config.routing
    if routing is None:
        return 0
    from specguard.playbook.routing.nginx_test import nginx_test

    label = loaded.config_file or "<defaults>"
    tested = nginx_test(routing, label)
    if tested is None:
        print("routing: nginx is not installed on this host; `nginx -t` not run")
        return 0
    if not tested.ok:
        print(f"{label}: routing: nginx -t refuses the rendered router: {tested.detail}", file=sys.stderr)
        print("1 error(s)", file=sys.stderr)
        return 1
    print(f"routing: {len(routing.classes)} class(es), nginx -t passed ({tested.detail})")
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
