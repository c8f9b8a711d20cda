"""The backtest benchmark's result as Markdown (``bench_backtest.py`` measures; this says it)."""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specguard.config.loading import Loaded

HERE = Path(__file__).resolve().parent
TARGET = 10.0  # seconds, for the week
WEEK = 168.0
MIB = 2**20
FALLBACK_RULES = ("acceptance_fallback", "acceptance_collapse")


def trim_profile(text: str) -> str:
    """pstats' table from its header on, the repository's and the interpreter's paths made short."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    kept = [line.rstrip() for line in lines[head:] if line.strip()]
    roots = sorted(
        {str(HERE.parent) + "/", *(p + "/" for p in sys.path if p and p != str(HERE.parent))}, key=len
    )
    out = []
    for line in kept:
        for root in reversed(roots):
            line = line.replace(root, "")
        out.append(line)
    totals = next((line.strip() for line in lines if "function calls" in line), "")
    return "\n".join([totals, *out])


# --- the result -----------------------------------------------------------------------------------


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def git(*args: str) -> str:
    done = subprocess.run(
        ["git", "--no-optional-locks", *args], capture_output=True, text=True, cwd=HERE.parent, check=False
    )
    return done.stdout.strip()


def commit() -> str:
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{head} (with uncommitted changes in the tree)" if dirty else head


def report(
    built: dict[str, Any], f: dict[str, Any], args: argparse.Namespace, loaded: Loaded, method: Sequence[str]
) -> str:
    runs: list[Any] = f["runs"]
    totals = [r.seconds for r in runs]
    best, median = min(totals), statistics.median(totals)
    last = runs[-1].result
    assert last is not None
    evaluations = sum(r.judged.evaluations for r in last.rules)
    series = sum(len(t.at) for r in last.rules for t in r.judged.traces.values())
    phase = {k: statistics.median(r.phases.get(k, 0.0) for r in runs) for k in ("load", "judge", "act")}
    rest = statistics.median(r.seconds - sum(r.phases.values()) for r in runs)
    minutes = round(args.hours * 60)
    naives: list[Any] = f["naive runs"]
    naive = sorted(naives, key=lambda n: n.rounds + n.steps)[len(naives) // 2]  # the median run
    slice_runs: list[Any] = f["slice runs"]
    slice_median = statistics.median(r.seconds for r in slice_runs)
    slice_hours = (f["slice"][1] - f["slice"][0]) / 3600
    naive_total = naive.rounds + naive.steps
    extrapolated = naive.per_minute * minutes
    same = all(n.events == r.events for n, r in zip(naives, slice_runs, strict=True))
    full = args.hours == WEEK
    verdict = (
        ("met" if median < TARGET else "**NOT met**")
        if full
        else f"(a {args.hours:g} h period: not the target's week)"
    )
    period = f"{args.hours:g} hours" if not full else "the week"
    slice_from = datetime.fromtimestamp(f["slice"][0], UTC).strftime("%a %H:%M")
    slice_to = datetime.fromtimestamp(f["slice"][1], UTC).strftime("%a %H:%M")
    built_how = (
        "reused from an earlier run (--keep)" if built["reused"]
        else f"{fmt_s(built['wall'])} (of which `history.record` {fmt_s(built['record_seconds'])})"
    )  # fmt: skip

    rows = [
        (f"`backtest()` over {period}, best of {args.runs}", fmt_s(best), f"< {TARGET:g} s" if full else "", ""),
        (f"`backtest()` over {period}, median of {args.runs}", fmt_s(median), f"< {TARGET:g} s" if full else "", verdict),
        ("all runs", ", ".join(fmt_s(t) for t in totals), "", ""),
        ("phase: loading the history (`workers.history`), median", fmt_s(phase["load"]), "", f"{phase['load'] / median:.0%}"),
        ("phase: judge (`workers.judged_apart`: every rule at every minute, in workers), median", fmt_s(phase["judge"]), "", f"{phase['judge'] / median:.0%}"),
        ("phase: act (`act.act`: scratch store, dispatcher, flag), median", fmt_s(phase["act"]), "", f"{phase['act'] / median:.0%}"),
        ("the rest (episodes, matching), median", fmt_s(rest), "", f"{rest / median:.0%}"),
        (f"rule evaluations / series evaluations ({len(last.rules)} rules, {minutes} minutes)", f"{evaluations:,} / {series:,}", "", ""),
        ("rule evaluations per second (median run's whole time) / judged only", f"{evaluations / median:,.0f} / {evaluations / phase['judge']:,.0f}", "", ""),
        ("series evaluations per second (median run's whole time)", f"{series / median:,.0f}", "", ""),
        ("the act phase: events stored, its clock's steps, the fallback flag's changes (last run)", f"{runs[-1].stored:,}, {runs[-1].steps:,}, {len(last.flags.get('fallback', []))}", "", ""),
        ("peak RSS: before the first replay / once its history was loaded / after the replays / at the end (naive rounds too)", f"{f['rss before']:.0f} / {runs[0].rss_loaded:.0f} / {f['rss after']:.0f} / {f['rss end']:.0f} MiB", "", ""),
        (f"baseline: the daemon's rounds, one a minute, {slice_hours:g} h ({slice_from}-{slice_to}, {naive.minutes} rounds), median of {args.runs}", f"{fmt_s(naive_total)} ({fmt_s(naive.rounds)} rounds + {fmt_s(naive.steps)} dispatcher steps)", "", ""),
        ("baseline: all runs", ", ".join(fmt_s(n.rounds + n.steps) for n in naives), "", ""),
        ("baseline per minute of history", f"{naive.per_minute * 1000:.1f} ms", "", ""),
        (f"`backtest()` over the same {slice_hours:g} h, median of {args.runs} (alternated with the baseline's)", fmt_s(slice_median), "", f"{naive_total / slice_median:.1f} times as fast"),
        ("`backtest()` over the same slice: all runs", ", ".join(fmt_s(r.seconds) for r in slice_runs), "", ""),
        (f"baseline extrapolated to {period} ({minutes} minutes)", fmt_s(extrapolated), "", f"{extrapolated / median:.1f} times the backtest's median"),
        ("the same events and runs from both ways over the slice, every run", "yes" if same else f"**no**: {len(naive.events)} against {len(slice_runs[-1].events)}", "", ""),
        (f"building the history: {built['scrapes']:,} scrapes, {built['rows']:,} minute rows, {built['bytes'] / MIB:.1f} MB (not measured above)", built_how, "", ""),
        ("the builder's peak RSS (its own process)", f"{built['peak_rss_mib']:.0f} MiB", "", ""),
    ]  # fmt: skip
    table = "\n".join(
        [
            "| figure | value | target | met / share / ratio |",
            "|---|---|---|---|",
            *(f"| {' | '.join(r)} |" for r in rows),
        ]
    )

    by_kind: dict[str, Counter[str]] = {}
    for rule, _series, kind, *_ in runs[-1].events:
        by_kind.setdefault(rule, Counter())[kind] += 1
    per_rule = [
        "| rule | replayed every | evaluations | judge time (median; - when judged by the workers) | events | firings | action runs | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in last.rules:
        took = statistics.median(x.per_rule.get(r.name, 0.0) for x in runs)
        errors = ", ".join(f"{k} ({v})" for k, v in r.judged.errors.items()) or "none"
        per_rule.append(
            f"| {r.name} | {r.plan.every:g} s (live {r.plan.live_every:g} s) | {r.judged.evaluations:,} | {fmt_s(took) if took else '-'} "
            f"| {sum(by_kind.get(r.name, Counter()).values()):,} | {by_kind.get(r.name, Counter())['firing']} | {len(r.actions)} | {errors} |"
        )

    flaps = sum(1 for _rule, _series, kind, *_ in runs[-1].events if kind in ("pending", "inactive"))
    machine = f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores, SQLite {sqlite3.sqlite_version}"
    # The command as run, its --keep directory named as a placeholder (a path of this machine says nothing).
    shown = ["DIR" if sys.argv[i - 1] == "--keep" else a for i, a in enumerate(sys.argv[1:], 1)]
    command = "python benchmarks/bench_backtest.py " + " ".join(shown)
    text = f"""# `specguard backtest`: a week of 8 servers replayed for the shipped rule pack

{datetime.now(UTC):%a %b %d %H:%M:%S UTC %Y}, commit {commit()}. {machine}, shared with other work: its load average (1 min) was {f["load before"]:.1f} before the replays, {f["load after"]:.1f} after. The databases in a temporary directory on disk.

Command: `{command.strip()}`

{(chr(10) * 2).join(p.replace("``", "`") for p in method)}

{table}

Per rule (the last run; a firing's runs are the rehearsed `log` and, for {" and ".join(FALLBACK_RULES)}, the fallback):

{chr(10).join(per_rule)}

Of the {len(runs[-1].events):,} events, {flaps:,} are `pending` or `inactive` ones (a series breaching, then
back before the rule's `for`), which run no action: the acting phase stores and steps through only the
evaluations with a firing or a resolution, whose events the dispatcher acts on.
The latency rules' p95 and mean are over 5 minutes of 15 to 30 requests (the generator's 3 to 6 a
minute, e2e p95 inside vLLM's 2.5-5 s bucket), which cross 1.2 times the baseline often.
"""
    if f.get("profile"):
        text += f"""
## Where the time goes

One more `backtest()` over {period} under cProfile (which slows Python code: the order matters, not the
times), `-s tottime`, the top 25:

```
{f["profile"]}
```
"""
    return text
