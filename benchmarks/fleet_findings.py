"""What the fleet benchmark's numbers say would cut a round's time and the daemon's memory: each
finding with the run's own figures and the change in specguard's code it points to."""

from __future__ import annotations

import statistics
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


def findings(run: Run) -> list[str]:
    split = steady_split(run)
    steady, queries, server, query, rules, total = (
        split.steady, split.queries, split.server, split.query, split.rules, split.total
    )  # fmt: skip
    heaviest = max(queries, key=lambda q: q["server"])
    heavy = sum(q["server"] for q in queries if q["expr"] == heaviest["expr"]) / len(steady)
    probe = run.measured["together"]
    one, together = statistics.median(probe["one_by_one"]), statistics.median(probe["together"])
    replaces = next((row["calls"] for row in run.measured["profile"] if "(replace)" in row["function"]), None)
    items: list[str] = []
    warm = run.measured["warm"]
    if warm is not None:
        check = len(warm["rounds"]) // 2 - 1
        detector = warm["rules"][warm["rule"]]
        per_window = (
            (warm["rss_before"] - run.measured["rss_end"]) * MIB / max(1, warm["filled"] * warm["windows"])
        )
        items += [
            f"**The collapse detector's warm-up state** (engine/warmup.py `Held`, "
            f"engine/detector_state.py, store/commits.py). Every window of the warm-up is held in each "
            f"series' state, packed (three doubles a window, stored as base64: "
            f"{per_window:,.0f} bytes a window in memory here); at every 5 s evaluation the state is "
            f"decoded and encoded again, and the store deletes and rewrites the rule's every state: "
            f"{warm['detector_json'] / 1e6:,.1f} MB of JSON per evaluation near the end of the warm-up, "
            f"the detector's evaluation {_ms(statistics.median(detector[:check]))} instead of "
            f"{_ms(statistics.median(detector[check + 1 :]))} once calibrated, and the daemon's memory "
            f"from {run.measured['peak']:.0f} MiB to {warm['rss_before']:.0f} MiB with the windows held "
            f"and {warm['peak']:.0f} MiB at its peak (the old and new states of a round side by side). "
            f"Keeping the decoded states between evaluations instead of decoding them at each, and "
            f"storing the windows as they come (a table of warm-up windows appended to, not each "
            f"series' whole state rewritten every 5 s) would make the warm-up's cost per evaluation "
            f"depend on the series, not on the series times the windows. Every series starts its "
            f"warm-up with the daemon, so all of them are checked in the same round "
            f"({_ms(detector[check])} for the detector's evaluation): spreading the checks over the "
            f"next windows would flatten that round.",
        ]
    items += [
        f"**Reads one after another** (daemon/round.py). A round reads a rule's "
        f"signal, judges it, commits it, then reads the next: Prometheus ({_ms(server)} a round) and "
        f"the daemon's own work ({_ms(rules - query)} for the engine, the store and the dispatcher, "
        f"{_ms(query - server)} decoding answers) never overlap, though the machine has 2 cores. Starting "
        f"every rule's read at the round's start (then judging and committing in order, as now) would "
        f"overlap them; the round's {len(queries) // len(steady)} queries alone took {_ms(together)} "
        f"all at once against {_ms(one)} one after another. The detector's four queries "
        f"(sources/prometheus.py `_chain`) share one evaluation time and could go at once too.",
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
