"""The webhook intake benchmark's results and their report: the tables, the notes on what disturbed
the measurement, and the targets."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from intake_load import OPEN_CONNECTIONS, Run, Tally
from intake_servers import StoreCheck

RATIO_TARGET = 0.5  # specguard's throughput over the bare handler's, at least
P99_TARGET = 0.020  # seconds, at the open-loop rate


@dataclass
class Results:
    closed: list[Run]
    duplicates: Run | None
    opened: list[Run]
    rate: float
    rate_from: str
    payload_size: int
    bare: Tally
    specguard: Tally
    store: StoreCheck
    revision: str
    guard_cpu: float  # CPU seconds specguard used from its start to the SIGTERM
    guard_seconds: float  # and the seconds it ran


def median_of(runs: Sequence[Run], server: str, metric: Callable[[Run], float]) -> float:
    return statistics.median(metric(run) for run in runs if run.server == server)


def say(what: str, run: Run) -> None:
    print(
        f"{what}, {run.server}: {run.throughput:.0f} answered/s, p50 {ms(run.percentile(0.5))}, "
        f"p99 {ms(run.percentile(0.99))}, max {ms(max(run.latencies, default=0.0))}; CPU: server "
        f"{run.cpu.server:.0%}, load generator {run.cpu.client:.0%}, idle server {run.cpu.idle:.0%}, "
        f"others {run.cpu.others:.0%}" + (f"; sent late by {ms(run.lag)} at most" if run.rate else ""),
        flush=True,
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def yes(value: bool) -> str:
    return "yes" if value else "**NO**"


def report(results: Results, args: argparse.Namespace) -> tuple[str, bool]:
    closed, opened, store, guard = results.closed, results.opened, results.store, results.specguard

    def med(runs: Sequence[Run], server: str, metric: Callable[[Run], float]) -> float:
        return median_of(runs, server, metric)

    def each(runs: Sequence[Run], server: str, show: Callable[[Run], str]) -> str:
        return ", ".join(show(run) for run in runs if run.server == server)

    def pct(value: float) -> str:
        return f"{value:.0%}"

    ratio = med(closed, "specguard", lambda r: r.throughput) / med(closed, "bare", lambda r: r.throughput)
    open_p99 = med(opened, "specguard", lambda r: r.percentile(0.99))
    non_2xx = {status: count for status, count in guard.statuses.items() if not 200 <= status < 300}
    answered = sum(guard.statuses.values())
    lines = [
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}. The "
        f"server under test and the load generator (aiohttp's client, the benchmark's process) each run "
        f"in their own process and share the cores with the other server and whatever else runs on the "
        f"machine (the CPU of each is shown). Each request: a version 4 payload of "
        f"{results.payload_size} bytes with 2 alerts whose labels and fingerprints no other request "
        f"has, so every delivery is new and is stored before it is answered; "
        + (
            "every alert is one the alert rule takes (alertname Bench): each fires a new series of "
            "it and runs its action, the worst case; "
            if args.acted_on
            else "the alerts are ones no rule takes (alertname Load): stored and acted on by no rule; "
        )
        + f"a bearer token; keep-alive "
        f"connections. specguard: `specguard run` with one alert rule (`alert: {{match: {{alertname: "
        f"Bench}}}}`, severity info, action log), log level warning, its store (SQLite, WAL, "
        f"synchronous=FULL) on {fs_type(Path(tempfile.gettempdir()))}. Bare: an aiohttp handler that "
        f"reads the body and answers 200 without storing it, same server settings. specguard at "
        f"{results.revision}.",
        "",
        f"Closed loop: {args.concurrency} concurrent workers, {args.warmup:g} s warm-up then "
        f"{args.seconds:g} s measured, {args.rounds} rounds alternating bare and specguard; medians of "
        f"the rounds, each round in parentheses. CPU: share of one core over the measured seconds; "
        f'"idle server" is the other server, not under load at the time.',
        "",
        "| server | requests/s | p50 | p99 | server CPU | server CPU per request | load generator CPU | idle server CPU | other processes' CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("bare", "bare aiohttp, 200 without storing"),
        ("specguard", "specguard, new deliveries"),
    ):
        lines.append(
            f"| {label} | {med(closed, name, lambda r: r.throughput):.0f} "
            f"({each(closed, name, lambda r: f'{r.throughput:.0f}')}) | "
            f"{ms(med(closed, name, lambda r: r.percentile(0.5)))} | "
            f"{ms(med(closed, name, lambda r: r.percentile(0.99)))} "
            f"({each(closed, name, lambda r: ms(r.percentile(0.99)))}) | "
            f"{pct(med(closed, name, lambda r: r.cpu.server))} | "
            f"{us(med(closed, name, lambda r: r.cost))} ({each(closed, name, lambda r: us(r.cost))}) | "
            f"{pct(med(closed, name, lambda r: r.cpu.client))} | "
            f"{pct(med(closed, name, lambda r: r.cpu.idle))} ({each(closed, name, lambda r: pct(r.cpu.idle))}) | "
            f"{pct(med(closed, name, lambda r: r.cpu.others))} |"
        )
    dup = results.duplicates
    if dup is not None:
        lines.append(
            f"| specguard, repeated deliveries (all duplicates; one run of {dup.seconds:g} s) | "
            f"{dup.throughput:.0f} | {ms(dup.percentile(0.5))} | {ms(dup.percentile(0.99))} | "
            f"{pct(dup.cpu.server)} | {us(dup.cost)} | {pct(dup.cpu.client)} | {pct(dup.cpu.idle)} | "
            f"{pct(dup.cpu.others)} |"
        )
    all_in = results.guard_cpu / answered if answered else float("nan")
    lines += [
        "",
        f"Throughput ratio specguard / bare (closed-loop medians): **{ratio:.2f}** "
        f"(target: at least {RATIO_TARGET:g}). Server CPU per request, specguard / bare: "
        f"{med(closed, 'specguard', lambda r: r.cost) / med(closed, 'bare', lambda r: r.cost):.1f}. "
        f"specguard's CPU over its whole life ({results.guard_cpu:.0f} s in {results.guard_seconds:.0f} s, "
        f"warm-ups, idle turns and work left over after each run included) per request it answered: "
        f"{us(all_in)}.",
        *notes(closed),
        "",
        f"Open loop: requests sent at **{results.rate:.0f} req/s** ({results.rate_from}) whatever the "
        f"answers do, on up to {OPEN_CONNECTIONS} connections, {args.warmup:g} s warm-up then "
        f"{args.open_seconds:g} s measured, {args.rounds} rounds alternating; latency of every request "
        f"due in the measured seconds, counted from the moment it was due, however late its answer "
        f"came. The last column is how late the generator itself sent, at worst.",
        "",
        "| server | answered/s | p50 | p99 | max | server CPU | idle server CPU | other processes' CPU | sent late by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("bare", "specguard"):
        lines.append(
            f"| {name} | {med(opened, name, lambda r: r.throughput):.0f} | "
            f"{ms(med(opened, name, lambda r: r.percentile(0.5)))} | "
            f"{ms(med(opened, name, lambda r: r.percentile(0.99)))} "
            f"({each(opened, name, lambda r: ms(r.percentile(0.99)))}) | "
            f"{ms(med(opened, name, lambda r: max(r.latencies, default=0.0)))} "
            f"({each(opened, name, lambda r: ms(max(r.latencies, default=0.0)))}) | "
            f"{pct(med(opened, name, lambda r: r.cpu.server))} | {pct(med(opened, name, lambda r: r.cpu.idle))} | "
            f"{pct(med(opened, name, lambda r: r.cpu.others))} | "
            f"{ms(max(r.lag for r in opened if r.server == name))} |"
        )
    outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(guard.outcomes.items()))
    runs = ", ".join(f"{count} {status}" for status, count in sorted(store.runs.items())) or "none"
    stop_text = (
        f"{store.stop_seconds:.1f} s, exit code {store.exit_code}"
        if store.exit_code is not None
        else f"**had not exited after {store.stop_seconds:.0f} s: killed**"
    )
    lines += [
        "",
        "What specguard answered over the whole benchmark (warm-ups included), and what its store held "
        "after it stopped:",
        "",
        "| | count |",
        "|---|---|",
        f"| requests answered 2xx | {guard.ok} ({outcomes}) |",
        f"| answered otherwise | {sum(non_2xx.values())}"
        + "".join(
            f"; {status}: {count} ({guard.reasons.get(status, '')!r})"
            for status, count in sorted(non_2xx.items())
        )
        + " |",
        f"| no answer (client errors) | {sum(guard.errors.values())}"
        + "".join(f"; {name}: {count}" for name, count in sorted(guard.errors.items()))
        + " |",
        f"| rows in `deliveries` | {store.deliveries} (one per 2xx answer) |",
        f"| rows in `alert_receipts` | {store.receipts} (the 2xx answers said {guard.new_alerts} new) |",
        f"| **deliveries answered 2xx, not in the store (lost)** | {store.missing_deliveries} |",
        f'| **alerts answered "stored", not in the store (lost)** | {store.missing_receipts} |',
        f"| deliveries in the store without a 2xx answer | {store.extra_deliveries} |",
        f"| alert receipts not yet acted on when specguard stopped | {store.unprocessed} |",
        f"| the alert rule's series / events / action runs | {store.series} / {store.events} / {runs} |",
        f"| SIGTERM to exit | {stop_text} |",
        f"| warnings and errors in specguard's log | {len(store.log_problems)} |",
        "",
        "Targets:",
        "",
        f"- throughput at least {RATIO_TARGET:g} x bare: {yes(ratio >= RATIO_TARGET)} ({ratio:.2f})",
        f"- p99 at most {ms(P99_TARGET)} at {results.rate:.0f} req/s: {yes(open_p99 <= P99_TARGET)} "
        f"({ms(open_p99)})",
        f"- every 2xx stored, none lost: {yes(not store.lost)}",
        f"- every request answered 2xx: {yes(not non_2xx and not guard.errors)}",
    ]
    said = Counter(store.log_problems)
    if said:
        lines += ["", "specguard's log, warnings and errors:", ""]
        lines += [f"- {count} x {message}" for message, count in said.most_common(10)]
    return "\n".join(lines), not store.lost


def notes(closed: Sequence[Run]) -> list[str]:
    """What disturbed the measurement, when something did."""
    out = []
    client = median_of(closed, "bare", lambda r: r.cpu.client)
    server = median_of(closed, "bare", lambda r: r.cpu.server)
    if client >= 0.75 and client > server:
        out += [
            "",
            f"The load generator used {client:.0%} of a core against the bare server (which used "
            f"{server:.0%}): the bare throughput is bounded by the generator as much as by the server, "
            f"so the ratio flatters specguard.",
        ]
    idle = median_of(closed, "bare", lambda r: r.cpu.idle)
    if idle >= 0.1:
        out += [
            "",
            f"specguard, the idle server during the bare runs, still used {idle:.0%} of a core (median) "
            f"acting on the alerts it had taken in: that CPU was taken from the bare runs, so the ratio "
            f"flatters specguard, and the work is part of what each delivery costs it.",
        ]
    others = max(run.cpu.others for run in closed)
    if others >= 0.2:
        out += [
            "",
            f"Other processes used up to {others:.0%} of a core during the closed-loop runs: the "
            f"machine was shared, which is why the rounds alternate.",
        ]
    return out


def fs_type(path: Path) -> str:
    """The file system type of ``path`` (from /proc/mounts), for the table."""
    best, kind = "", "?"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind
