"""What the fleet benchmark's numbers say would cut a round's time and the daemon's memory: each
finding with the run's own figures and the change in specguard's code it points to."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.fleet_report import Run

MIB = 2**20


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


@dataclass(frozen=True)
class Split:
    """A steady round's mean: its queries, Prometheus's time on them, their whole time (transfer
    and decoding too), the rules' time, and the round's."""

    steady: range
    queries: list[dict[str, Any]]
    server: float
    query: float
    rules: float
    total: float


def steady_split(run: Run) -> Split:
    steady = range(run.settled, len(run.rounds))
    queries = [q for q in run.measured["queries"] if q["round"] in steady]
    return Split(
        steady,
        queries,
        sum(q["server"] for q in queries) / len(steady),
        sum(q["seconds"] for q in queries) / len(steady),
        sum(sum(took[run.settled :]) for took in run.measured["rules"].values()) / len(steady),
        sum(run.steady) / len(steady),
    )


def phase_ranges(warm: Mapping[str, Any]) -> tuple[range, range, range]:
    """The warm phase's rounds before any warm-up is complete, while they are checked, and after."""
    phases = warm["phases"]
    return range(*phases["before"]), range(*phases["checking"]), range(*phases["after"])


def findings(run: Run) -> list[str]:
    split = steady_split(run)
    steady, queries, server, rules, total = (
        split.steady,
        split.queries,
        split.server,
        split.rules,
        split.total,
    )
    heaviest = max(queries, key=lambda q: q["server"])
    heavy = sum(q["server"] for q in queries if q["expr"] == heaviest["expr"]) / len(steady)
    replaces = next((row["calls"] for row in run.measured["profile"] if "(replace)" in row["function"]), None)
    items: list[str] = []
    warm = run.measured["warm"]
    if warm is not None:
        before, checking, after = phase_ranges(warm)
        detector = warm["rules"][warm["rule"]]
        per_window = (
            (warm["rss_before"] - run.measured["rss_end"]) * MIB / max(1, warm["filled"] * warm["windows"])
        )
        items += [
            f"**The collapse detector's warm-up** (engine/warmup.py `Held`, engine/detection.py, "
            f"store/commits.py). Every window of the warm-up is held in each series' state, packed (24 "
            f"bytes a window; {per_window:,.0f} bytes a window of the daemon's memory here), and "
            f"decoded only for the check; an evaluation adds its window by one copy of those bytes, and "
            f"the store writes them to their own column, not into the state's JSON: "
            f"{warm['stored_json'] / 1e6:,.1f} MB of JSON and {warm['stored_windows'] / 1e6:,.1f} MB of "
            f"windows per evaluation near the end of the warm-up. The detector's evaluation took "
            f"{_ms(statistics.median(detector[i] for i in before))} then, against "
            f"{_ms(statistics.median(detector[i] for i in after))} once calibrated, and up to "
            f"{_ms(max(detector[i] for i in checking))} in the {len(checking)} "
            f"round{'s' if len(checking) != 1 else ''} that checked up to {warm['checks_per_evaluation']} "
            f"warm-ups each (a check is the windows decoded and a CUSUM "
            f"each way over them, in Python). Storing the windows as they come (a table appended to, "
            f"not each series' windows rewritten every 5 s) would make the store's share depend on the "
            f"series alone; it is {warm['stored_windows'] / 1e6:,.1f} MB a round here.",
        ]
    items += [
        f"**The heaviest query** ({heaviest['rule']}: {_ms(heavy)} of Prometheus's "
        f"{_ms(server)} a round): `{heaviest['expr']}` reads every bucket of every server over its window "
        f"(a sample every {run.written.step} s). A Prometheus recording rule of the bucket rates, read "
        f"by an `expr:` rule, would take it off the round (Prometheus would still do the work, on its "
        f"own schedule).",
    ]
    if replaces is not None:
        items.append(
            f"**The engine's copies** (engine/states.py `_Stepper`): "
            f"`dataclasses.replace` runs {replaces:,.0f} times a round, three times per series and rule "
            f"(`data`, then `_move` twice), copying every field of the state each time (its own time "
            f"is in the profile above); building one new state per series would do."
        )
    items.append(
        f"**The status line** (daemon/self_status.py `status_line`): every round "
        f"builds daemon/status.py `rule_rows`, a dict per series of every rule with each detector's "
        f"`shown()` decoding its whole state, to name the rules that fire or wait: the round's work "
        f"outside its rules was {_ms(total - rules)}. Counting the states of `shared.states` directly "
        f"would cost next to nothing."
    )
    return [
        f"## What would cut the round and the memory, {run.servers:,} servers",
        "",
        *(f"{i}. {item}" for i, item in enumerate(items, 1)),
    ]
