"""The collapse detector benchmark's report: its markdown tables (false alarms, detection delays,
the settings varied, what one window holds), the targets, and the dispersion table of
``--dispersion``."""

from __future__ import annotations

import platform
import subprocess
from datetime import UTC, datetime
from typing import Any

from benchmarks.collapse_rules import rules
from benchmarks.collapse_traffic import HEAVY_SIGMA


def dispersion_report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| load | request lengths | k | days | 2 min | 5 min | 10 min | warm-ups | learned phi, median [10-90 %] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, mid, high = r["learned"]
        by = r["by_minutes"]
        lines.append(
            f"| {r['load']} | {'lognormal' if r['heavy'] else 'geometric'} | {r['k']} | {r['days']} "
            f"| {by[2]:.0f} | {by[5]:.0f} | {by[10]:.0f} | {r['warmups']} | {mid:.0f} [{low:.0f}-{high:.0f}] |"
        )
    return "\n".join(lines) + "\n"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def report(
    fa: list[dict[str, Any]], dr: list[dict[str, Any]], sweep: list[dict[str, Any]], took: float
) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    # What the figures depend on: the benchmark, the evaluation path it drives, the model it draws from.
    measured_path = [
        "benchmarks/bench_collapse_detector.py", "benchmarks/collapse_traffic.py",
        "benchmarks/collapse_rules.py", "benchmarks/collapse_report.py",
        "daemon/evaluation.py", "daemon/readings.py", "engine/detection.py", "engine/detector_state.py",
        "engine/states.py", "config/loading.py", "common/sequential.py", "rules", "sim/model.py",
    ]  # fmt: skip
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *measured_path],
        capture_output=True,
        text=True,
        check=False,
    )
    detector_rule, _ = rules()
    detect = detector_rule.rule.detect
    assert detect is not None
    measured = (commit.stdout.strip() or "?") + (" with uncommitted changes" if dirty.stdout.strip() else "")
    lines = [
        "# The collapse detector against the playbook's rule (accelerated time)",
        "",
        f"{datetime.now(UTC):%a %b %d %H:%M:%S UTC %Y}, commit {measured}. "
        f"Python {platform.python_version()}, {platform.machine()}; {took:.0f} s in all.",
        "",
        "Traffic: 32, 16 or 4 requests in flight, each lasting 30 s on average, drafting 10 times a",
        "second (Poisson); how long a request lasts is geometric (memoryless), or in the heavy-tailed",
        f"scenario lognormal with the same mean (sd of log {HEAVY_SIGMA}: median 10 s, 1 in 100 over 5",
        "minutes). A request's acceptance is the level times its own factor, a Beta of spread 0.1 around",
        "0.75 (`sim.model.request_factor`'s law, `--acceptance-spread 0.1`); chain drafts of k tokens",
        "(`sim.model.sample_accepted`'s law). Both rules are the shipped pack's, evaluated by",
        "`daemon.evaluation` on a simulated clock:",
        f"`acceptance_collapse` ({detect.describe()}{', and each window by itself' if detect.single_window else ''}; every 5 s, warm-up {detect.warmup / 60:.0f} min,",
        f"at most one false alarm per {detect.false_alarm_every / 86400:.0f} days by Lorden's bound) and",
        "`acceptance_fallback` (acceptance_rate < 0.4 in three 60 s evaluations in a row).",
        "",
    ]
    lines += [
        "## False alarms, stationary traffic at 0.75",
        "",
        "phi: the detector's, learned over its warm-up (window phi times the autocorrelation's",
        "factor); window phi: the windows' own. Lowest window: the lowest alpha-hat of a 5 s window",
        "after the warm-up.",
        "",
        "| load | request lengths | k | days | acceptance_collapse | acceptance_fallback | phi | window phi | alpha0 learned | lowest window |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in fa:
        lengths = "lognormal" if row["heavy"] else "geometric"
        lines.append(
            f"| {row['load']} | {lengths} | {row['k']} | {row['days']} | {row['detector']} | {row['playbook']} "
            f"| {row['phi']:.1f} | {row['window_phi']:.1f} | {row['alpha0']:.3f} | {row['lowest']:.3f} |"
        )
    lines += [
        "",
        "## Detection of a drop at a random moment (delay from the drop to the firing)",
        "",
        "Caught: fired within 10 minutes of the drop. Before: firings before the drop (false alarms in",
        "the runs' in-control minutes).",
        "",
        "| load | k | drop | runs | collapse: caught | median | p90 | before | fallback: caught | median | p90 | before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in dr:
        d, p = row["detector"], row["playbook"]
        lines.append(
            f"| {row['load']} | {row['k']} | 0.75 -> {row['to']} | {row['runs']} | {d['caught']} | {_s(d['median'])} "
            f"| {_s(d['p90'])} | {d['early']} | {p['caught']} | {_s(p['median'])} | {_s(p['p90'])} | {p['early']} |"
        )
    lines += [
        "",
        "## The shipped rule's settings varied, 16 requests, 0.75 -> 0.45",
        "",
        "Median (p90) delay of the detector, and its phi (median of the runs' warm-ups). h follows the",
        "interval (ln(30 days / interval) + ln(tests): the levels and the window test), so each variant",
        "keeps the bound of one false alarm in 30 days.",
        "",
        "| variant | k | runs | caught | median | p90 | phi |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sweep:
        d = row["detector"]
        lines.append(
            f"| {row['variant']} | {row['k']} | {row['runs']} | {d['caught']} | {_s(d['median'])} "
            f"| {_s(d['p90'])} | {row['phi']:.0f} |"
        )
    big = [r for r in dr if r["to"] == 0.45]
    subtle = [r for r in dr if r["to"] == 0.62]
    lines += [
        "",
        "## What one window holds",
        "",
        "The highest alpha-hat of the first whole 5 s window after 0.75 -> 0.45, over the runs,",
        f"against the lowest in-control window of the {fa[0]['days'] if fa else '-'} days (geometric lengths):",
        "",
    ]
    for row in big:
        lowest = [
            r["lowest"] for r in fa if r["load"] == row["load"] and r["k"] == row["k"] and not r["heavy"]
        ]
        lines.append(
            f"- {row['load']} k={row['k']}: first window after the drop at most "
            f"{row['first_window_highest']:.3f}; lowest in-control window "
            + (f"{lowest[0]:.3f}" if lowest else "-")
        )
    lines += [
        "",
        "## Targets",
        "",
        "- median delay for 0.75 -> 0.45 at most 20 s: "
        + ", ".join(f"{r['load']} k={r['k']} {_s(r['detector']['median'])}" for r in big),
        "- 0.75 -> 0.62 caught within 10 minutes in at least 95 % of runs: "
        + ", ".join(
            f"{r['load']} k={r['k']} {100 * r['detector']['caught'] / r['runs']:.0f} %" for r in subtle
        ),
        "- at most one false alarm in 30 days: "
        + ", ".join(
            f"{r['load']} k={r['k']}{' lognormal' if r['heavy'] else ''} {r['detector']}" for r in fa
        ),
    ]
    return "\n".join(lines) + "\n"
