"""The fleet benchmark's results as Markdown: per fleet size, then for the largest fleet per rule,
where a round's time goes, what reading the rules' queries at once would save, and the states."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.fleet_findings import findings, phase_ranges, steady_split
from benchmarks.fleet_series import Written

ROUND_TARGET = 2.0  # seconds, a round over 1,000 servers
RSS_TARGET = 200e6  # bytes (200 MB), the daemon's peak
MIB = 2**20


@dataclass
class Run:
    servers: int
    written: Written
    text_bytes: int
    text_seconds: float
    blocks_seconds: float
    measured: dict[str, Any]  # fleet_round.py's answer, with Prometheus's CPU, memory and the load
    log_lines: int
    warnings: list[str]

    @property
    def rounds(self) -> list[float]:
        return [float(t) for t in self.measured["rounds"]]

    @property
    def first(self) -> float:
        return self.rounds[0]

    @property
    def later(self) -> list[float]:
        return self.rounds[1:]

    @property
    def settled(self) -> int:
        """The index of the first of the last half of the rounds (Prometheus warm)."""
        return len(self.rounds) - max(1, (len(self.rounds) - 1) // 2)

    @property
    def steady(self) -> list[float]:
        return self.rounds[self.settled :]

    def per_round(self, key: str) -> float:
        return float(self.measured[key]) / len(self.rounds)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def time_table(runs: list[Run]) -> list[str]:
    base = runs[0]
    n, settled = len(base.rounds), base.settled
    lines = [
        f"| servers | series in Prometheus | first round | rounds 2-{n}: median | rounds 2-{n}: max "
        f"| rounds {settled + 1}-{n}: median | rounds {settled + 1}-{n}: max "
        f"| median of rounds {settled + 1}-{n} / the {base.servers}-server fleet's | load average (1 min) before, after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        ratio = statistics.median(run.steady) / statistics.median(base.steady)
        before, after = run.measured["load"]
        lines.append(
            f"| {run.servers:,} | {run.written.series:,} | {_ms(run.first)} | {_ms(statistics.median(run.later))} | "
            f"{_ms(max(run.later))} | {_ms(statistics.median(run.steady))} | {_ms(max(run.steady))} | "
            f"{ratio:.1f} | {before:.1f}, {after:.1f} |"
        )
    return lines


def resource_table(runs: list[Run]) -> list[str]:
    lines = [
        "| servers | samples | OpenMetrics text, promtool's blocks (its peak RSS, the text it maps included) | Prometheus: every series queryable after "
        "| daemon CPU per round | Prometheus CPU per round | daemon RSS before the first round | after it "
        "| daemon peak RSS | Prometheus RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        m = run.measured
        lines.append(
            f"| {run.servers:,} | {run.written.samples:,} | {run.text_bytes / MIB:,.0f} MiB in "
            f"{run.text_seconds:.0f} s, blocks in {run.blocks_seconds:.0f} s ({m['promtool_peak']:,.0f} MiB) | "
            f"{m['prometheus_ready']:.1f} s | "
            f"{_ms(run.per_round('cpu'))} | {_ms(run.per_round('prometheus_cpu'))} | {m['rss_before']:.0f} MiB | "
            f"{m['rss_after_first']:.0f} MiB | {m['peak']:.0f} MiB | {m['prometheus_memory']['VmRSS']:,.0f} MiB |"
        )
    return lines


def rule_table(run: Run) -> list[str]:
    """Per rule, over the steady rounds."""
    steady = range(run.settled, len(run.rounds))
    queries = [q for q in run.measured["queries"] if q["round"] in steady]
    lines = [
        "| rule | queries a round | rule's time (median; from its turn: its answer, asked at the round's start, then judged and stored) | its queries (mean) | Prometheus, to the answer's "
        "headers (mean) | answer size | series per answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule, took in run.measured["rules"].items():
        mine = [q for q in queries if q["rule"] == rule]
        size = statistics.median([q["size"] for q in mine]) if mine else 0
        series = statistics.median([q["series"] for q in mine]) if mine else 0
        lines.append(
            f"| {rule} | {len(mine) // len(steady)} | {_ms(statistics.median(took[run.settled :]))} | "
            f"{_ms(sum(q['seconds'] for q in mine) / len(steady))} | "
            f"{_ms(sum(q['server'] for q in mine) / len(steady))} | {size / 1024:,.0f} KiB | {series:,.0f} |"
        )
    return lines


def _group_times(
    rules: Mapping[str, list[float]],
    names: list[str],
    rounds: range,
    of: Callable[[Iterable[float]], float] = statistics.median,
) -> float:
    """``of`` (the median unless said) over ``rounds`` of the summed times of rules ``names``."""
    return of(sum(rules[name][i] for name in names) for i in rounds)


def schedule_table(run: Run) -> list[str]:
    """The daemon's own rounds: the rules of each interval, as the sum of their times."""
    groups: dict[float, list[str]] = {}
    for name, every in run.measured["intervals"].items():
        groups.setdefault(float(every), []).append(name)
    warm = run.measured["warm"]
    head = "| the daemon's round | its rules | a daemon just started (median of the steady rounds) |"
    rule = "|---|---|---|"
    if warm:
        head += (
            " near the warm-up's end, before the checks (median) | while the warm-ups are checked "
            "(median, max) | after them (median) |"
        )
        rule += "---|---|---|"
    lines = [head, rule]
    for every, names in sorted(groups.items()):
        row = (
            f"| every {every:g} s | {', '.join(names)} | "
            f"{_ms(_group_times(run.measured['rules'], names, range(run.settled, len(run.rounds))))} |"
        )
        if warm:
            took, (before, checking, after) = warm["rules"], phase_ranges(warm)
            row += (
                f" {_ms(_group_times(took, names, before))} | {_ms(_group_times(took, names, checking))}, "
                f"{_ms(_group_times(took, names, checking, max))} | {_ms(_group_times(took, names, after))} |"
            )
        lines.append(row)
    return lines


def where_time_goes(run: Run) -> list[str]:
    """A steady round's mean split: Prometheus, the answers' transfer and decoding, the rest of the
    rules' evaluation (engine, store, dispatch), and the round around them."""
    split = steady_split(run)
    steady, queries, server, query, rules, total = (
        split.steady,
        split.queries,
        split.server,
        split.query,
        split.rules,
        split.total,
    )
    slowest = max(queries, key=lambda q: q["server"])
    biggest = max(queries, key=lambda q: q["size"])
    daemon = run.per_round("cpu")
    return [
        f"- the round asks for its rules' readings at once, at its start (the Prometheus source "
        f"`reads_ahead`), and judges and stores each rule in turn as its answer comes: Prometheus "
        f"evaluating and encoding the {len(queries) // len(steady)} queries took {_ms(server)} a round "
        f"in all (their times added up: they overlap one another and the daemon's work), the whole "
        f"queries with their transfer and decoding {_ms(query)};",
        f"- the daemon's CPU a round (decoding the answers, the engine over every series, the store's "
        f"commit of every state, the events to the dispatcher): {_ms(daemon)};",
        f"- the round took {_ms(total)}: {total / (server + daemon):.0%} of those two one after the other "
        f"({_ms(server + daemon)}); its rules' evaluations, each from its turn to its answer judged "
        f"and stored, {_ms(rules)}, the round around them (its metrics, the status line) "
        f"{_ms(total - rules)}.",
        "",
        f"The slowest query for Prometheus ({slowest['rule']}, {_ms(slowest['server'])}): "
        f"`{slowest['expr']}`. The largest answer: {biggest['size'] / 1024:,.0f} KiB for "
        f"{biggest['series']:,} series ({biggest['rule']}).",
    ]


def together(run: Run) -> list[str]:
    probe = run.measured["together"]
    one, all_ = statistics.median(probe["one_by_one"]), statistics.median(probe["together"])
    count = sum(1 for q in run.measured["queries"] if q["round"] == len(run.rounds) - 1)
    return [
        f"After the rounds, the last round's {count} queries at its moment, one after another (as a round "
        f"asked them before it asked ahead): {_ms(one)} (median of {len(probe['one_by_one'])}); all at "
        f"once through the same source, as a round asks them now: {_ms(all_)}, {one / all_:.1f} times as fast.",
    ]


def profile_table(run: Run) -> list[str]:
    rows = [row for row in run.measured["profile"] if "epoll" not in row["function"]]
    if not rows:
        return []
    lines = [
        "The event loop's thread under cProfile over 3 more rounds at the last moment (own time per round, "
        "its waits for answers left out; cProfile slows Python code, so the times are inflated, their "
        "order is what matters; the store's writer thread is not in it):",
        "",
        "| function | calls a round | own time a round |",
        "|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| `{row['function']}` | {row['calls']:,.0f} | {_ms(row['seconds'])} |")
    return lines


def warm_table(runs: list[Run]) -> list[str]:
    """The second phase: each fleet's daemon near the end of its detectors' warm-up."""
    if any(run.measured["warm"] is None for run in runs):
        return []
    first = runs[0].measured["warm"]
    lines = [
        f"| servers | series filled | what the store writes for {first['rule']} each evaluation: JSON, "
        f"windows | rounds before the checks: median, max | rounds while the warm-ups are checked: how many, "
        f"median, max | rounds after: median, max | {first['rule']}'s time: before, while checked (max), after "
        f"(medians) | series still warming after the checks | RSS after filling | RSS after the rounds | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        w = run.measured["warm"]
        took, detector = w["rounds"], w["rules"][w["rule"]]
        before, checking, after = phase_ranges(w)

        def median_max(rounds: range, times: list[float] = took) -> str:
            picked = [times[i] for i in rounds]
            return f"{_ms(statistics.median(picked))}, {_ms(max(picked))}"

        lines.append(
            f"| {run.servers:,} | {w['filled']:,} | {w['stored_json'] / 1e6:,.1f} MB, "
            f"{w['stored_windows'] / 1e6:,.1f} MB | {median_max(before)} | {len(checking)}: {median_max(checking)} | "
            f"{median_max(after)} | {_ms(statistics.median(detector[i] for i in before))}, "
            f"{_ms(statistics.median(detector[i] for i in checking))} ({_ms(max(detector[i] for i in checking))}), "
            f"{_ms(statistics.median(detector[i] for i in after))} | {w['holding'][checking[-1]]:,} | "
            f"{w['rss_before']:.0f} MiB | {w['rss_end']:.0f} MiB | {w['peak']:.0f} MiB |"
        )
    return lines


def warm_section(runs: list[Run], args: argparse.Namespace) -> list[str]:
    table = warm_table(runs)
    if not table:
        return []
    w = runs[-1].measured["warm"]
    before, checking, after = phase_ranges(w)
    return [
        "## A daemon an hour old: the end of the collapse detector's warm-up",
        "",
        f"`acceptance_collapse` learns each series' level over `warmup: 1h` of 5 s windows and keeps "
        f"every window of it (packed, 24 bytes a window, in the series' state and in a column of its "
        f"own in the store) until the warm-up is checked for one level: a daemon started an hour ago "
        f"holds {w['windows'] + len(before) + 1:,} windows per series. After the rounds above, each "
        f"fleet's daemon had its detector states filled the way the warm-up fills them "
        f"(benchmarks/fleet_warmup.py: {w['windows']:,} windows each, at the level of the series' own "
        f"windows), then ran more rounds over the same data, {w['window']:g} s of it apart: "
        f"{len(before)} before any warm-up is complete; then, every series having started its warm-up "
        f"with the daemon, all of them are due in the same round, and an evaluation checks at most "
        f"{w['checks_per_evaluation']} (those that waited longest first; the rest wait a window, still "
        f"warming up), so that {w['filled']:,} series are checked over {len(checking)} round{'s' if len(checking) != 1 else ''}; then "
        f"{len(after)} more.",
        "",
        *table,
    ]


def states_table(run: Run) -> list[str]:
    lines = ["| rule | series | inactive | pending | firing | resolved |", "|---|---|---|---|---|---|"]
    for rule, counts in run.measured["states"].items():
        lines.append(
            f"| {rule} | {sum(counts.values()):,} | {counts['inactive']:,} | {counts['pending']:,} | "
            f"{counts['firing']:,} | {counts['resolved']:,} |"
        )
    return lines


def verdicts(run: Run) -> list[str]:
    n, settled = len(run.rounds), run.settled
    worst, worst_steady = max(run.rounds), max(run.steady)
    over = [i + 1 for i, t in enumerate(run.rounds) if t >= ROUND_TARGET]
    if worst < ROUND_TARGET:
        said = f"met by a daemon just started: every one of the {n} rounds took under 2 s (at most {worst:.2f} s)."
    elif worst_steady < ROUND_TARGET:
        said = (
            f"met by a daemon just started once Prometheus is warm, not by every round: rounds "
            f"{settled + 1}-{n} took at most {worst_steady:.2f} s, but {len(over)} of the {n} rounds took "
            f"2 s or more (round(s) {', '.join(map(str, over))}; at most {worst:.2f} s)."
        )
    else:
        said = (
            f"NOT met by a daemon just started: {len(over)} of the {n} rounds took 2 s or more, "
            f"{len([t for t in run.steady if t >= ROUND_TARGET])} of the last {n - settled} (at most "
            f"{worst:.2f} s; median of rounds {settled + 1}-{n} {statistics.median(run.steady):.2f} s)."
        )
    peak = run.measured["peak"] * MIB
    daemon, prometheus = run.per_round("cpu"), run.per_round("prometheus_cpu")
    lines = [
        f"- **A round under 2 s over {run.servers:,} servers: {said}** The first round took {run.first:.2f} s. "
        f"The CPU a round used, which the machine's other work changes little: the daemon's "
        f"{daemon:.2f} s and Prometheus's {prometheus:.2f} s; a round asks for all its readings at once and "
        f"judges each as it comes, so that the two overlap: their sum is {daemon + prometheus:.2f} s.",
        f"- **The daemon's RSS under 200 MB: {'met' if peak < RSS_TARGET else 'NOT met'} by a daemon just "
        f"started.** Its peak over the {n} rounds was {peak / 1e6:.0f} MB ({run.measured['peak']:.0f} MiB; "
        f"{run.measured['rss_before']:.0f} MiB before the first round, {run.measured['rss_end']:.0f} MiB "
        f"after the last).",
    ]
    warm = run.measured["warm"]
    if warm is not None:
        took = warm["rounds"]
        worst_warm = max(took)
        worst_at = took.index(worst_warm)
        _, checking, _ = phase_ranges(warm)
        where = "while the warm-ups were checked" if worst_at in checking else "outside the checks"
        warm_peak = warm["peak"] * MIB
        lines += [
            f"- **Near the end of the collapse detector's warm-up (a daemon started an hour ago), a round "
            f"under 2 s is {'met' if worst_warm < ROUND_TARGET else 'NOT met'}:** its {len(took)} rounds took "
            f"{statistics.median(took):.2f} s median, {worst_warm:.2f} s at most ({where}); CPU per round: "
            f"the daemon's {warm['cpu'] / len(took):.2f} s and Prometheus's "
            f"{warm['prometheus_cpu'] / len(took):.2f} s.",
            f"- **Near the end of the warm-up, the RSS under 200 MB is "
            f"{'met' if warm_peak < RSS_TARGET else 'NOT met'}:** the peak was {warm_peak / 1e6:.0f} MB "
            f"({warm['peak']:.0f} MiB; {warm['rss_before']:.0f} MiB once the detectors' states were filled).",
        ]
    return lines


def report(runs: list[Run], args: argparse.Namespace, command: str, machine: str) -> str:
    big = runs[-1]
    errors = big.measured["errors"]
    said: dict[str, int] = {}
    for message in big.warnings:  # "acceptance_fallback firing: Acceptance 0.06 below ..."
        what = message.split(":", 1)[0]
        said[what] = said.get(what, 0) + 1
    kinds = big.written.kinds
    n, settled = len(big.rounds), big.settled
    return "\n".join(
        [
            "# A central watch over many servers: the Prometheus source",
            "",
            f"The shipped rule pack (8 rules) evaluated by the daemon's own rounds through the Prometheus "
            f"source, over each fleet's series backfilled into a real Prometheus (Debian's 2.42, "
            f"`promtool tsdb create-blocks-from openmetrics`, no scraping) on 127.0.0.1. Each server has "
            f"the catalog's vLLM families with a real vLLM 0.32.0 page's labels, a sample every "
            f"{args.scrape_every} s over {args.minutes:g} minutes. {n} rounds per fleet, back to back, "
            f"round i asking about the data {args.every:g} s after round i - 1; every round evaluates all "
            f"eight rules (the daemon spreads them over its 5 s, 15 s and 60 s rounds: this is their sum). "
            f"Prometheus was started just before the first round: rounds {settled + 1}-{n} are the "
            f"steady state of a Prometheus that has run a while. The daemon's parts run in a process of "
            f"their own; its RSS is that process's. Machine: {machine}, shared with other work (its "
            f"load average is in the table). Ratios are to the {runs[0].servers}-server fleet of the "
            f"same run.",
            "",
            f"Command: `{command.strip()}`",
            "",
            *verdicts(big),
            "",
            *time_table(runs),
            "",
            f"The daemon does not run the eight rules in one round: each interval has its own. Its rounds "
            f"over {big.servers:,} servers, as the sum of their rules' times:",
            "",
            *schedule_table(big),
            "",
            *resource_table(runs),
            "",
            f"## Per rule, {big.servers:,} servers (rounds {settled + 1}-{n})",
            "",
            *rule_table(big),
            "",
            f"## Where a steady round's time goes, {big.servers:,} servers",
            "",
            *where_time_goes(big),
            "",
            *together(big),
            "",
            *profile_table(big),
            "",
            *warm_section(runs, args),
            "",
            *findings(big),
            "",
            f"## The states the rules hold after the {n} rounds of a daemon just started, {big.servers:,} servers",
            "",
            f"{kinds.get('healthy', 0):,} healthy servers, {kinds.get('collapsed', 0)} whose acceptance "
            f"collapsed 7 minutes before the end, {kinds.get('late', 0)} 90 s before it (during the "
            f"rounds), {kinds.get('pressured', 0)} with the KV cache over 95 %. "
            f"{big.measured['instances']:,} instances evaluated. acceptance_collapse learns its level "
            f"over an hour of rounds first, so it judges nothing in a run this short.",
            "",
            *states_table(big),
            "",
            f"Rule errors: {', '.join(f'{k}: {v}' for k, v in errors.items()) if errors else 'none'}. "
            f"Over both phases the daemon logged {big.log_lines:,} lines, {len(big.warnings)} at warning or above"
            + (": " + ", ".join(f"{c} x {what}" for what, c in sorted(said.items())) + "." if said else "."),
        ]
    )
