"""The collapse detector's warm-up check (``common.homogeneity`` through ``engine.warmup``): how often
it holds back a healthy warm-up (false rejections), how late that makes calibration, and which shifts
inside a warm-up it finds.

Traffic is the collapse benchmark's model of vLLM (``collapse_traffic.Traffic``: requests in
flight, each with its own acceptance, 30 s on average, geometric or lognormal lengths; chain drafts
of k tokens), in 5 s windows; the rule is the shipped ``acceptance_collapse`` (an hour's warm-up,
720 windows, drops 0.12 and 0.3).

- False rejections: a healthy hour at 0.75 per seed, checked as the detector checks it when its
  warm-up is full. A rejected one is then run through the detector itself
  (``daemon.evaluation.evaluate_rule``, the clock simulated) to see when it calibrates instead.
- Shifts found: an hour with a shift in it (a collapse for a few minutes, a step for the rest of
  the hour, traffic alternating every 90 s), the share of seeds whose check finds it.

Run (about two minutes on one core):
    .venv/bin/python benchmarks/bench_warmup_homogeneity.py [--seeds 500] [--write benchmarks/results/warmup_homogeneity.md]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.collapse_rules import Judge, detector_answer, rules
from benchmarks.collapse_traffic import LOADS, WINDOW, Traffic
from specguard.common.homogeneity import Window
from specguard.engine.warmup import examine

HOUR = 720
SCENARIOS = {
    "alternating 0.8 / 0.05 every 90 s": lambda rng: np.where((np.arange(HOUR) // 18) % 2 == 0, 0.8, 0.05),
    "5 min at 0.05": lambda rng: burst(rng, 0.05, 5),
    "1 min at 0.05": lambda rng: burst(rng, 0.05, 1),
    "2 min at 0.45": lambda rng: burst(rng, 0.45, 2),
    "10 min at 0.6": lambda rng: burst(rng, 0.6, 10),
    "0.45 from the middle on": lambda rng: step(0.45, 0.5),
    "0.55 from the middle on": lambda rng: step(0.55, 0.5),
    "0.63 from the middle on": lambda rng: step(0.63, 0.5),
    "0.05 for the first 40 min": lambda rng: np.concatenate([np.full(480, 0.05), np.full(240, 0.75)]),
}


def burst(rng: np.random.Generator, to: float, minutes: float) -> np.ndarray:
    levels = np.full(HOUR, 0.75)
    length = int(minutes * 60 / WINDOW)
    start = int(rng.integers(0, HOUR - length))
    levels[start : start + length] = to
    return levels


def step(to: float, at: float) -> np.ndarray:
    levels = np.full(HOUR, 0.75)
    levels[int(at * HOUR) :] = to
    return levels


def windows_of(counts: dict[str, np.ndarray]) -> list[Window]:
    trials = counts["accepted"] + counts["failures"]
    return [Window(float(s), float(n)) for s, n in zip(counts["accepted"], trials, strict=True) if n > 0]


def detect() -> Any:
    item, _ = rules()
    assert item.rule.detect is not None
    return item.rule.detect


async def calibrated_after(seed: int, k: int, load: str, heavy: bool) -> float | None:
    """Minutes the detector itself takes to calibrate on this seed's traffic (None: not in 4 hours)."""
    item, _ = rules()
    judge = Judge(item)
    traffic = Traffic(np.random.default_rng(seed), k, LOADS[load], heavy=heavy)
    w = 0
    for hours in (1, 3):  # the first hour drawn as false_rejections drew it, then three more
        counts = traffic.windows(np.full(hours * HOUR, 0.75))
        for accepted, failures in zip(counts["accepted"], counts["failures"], strict=True):
            w += 1
            await judge.evaluate(detector_answer(accepted, failures), w * WINDOW)
            state = next(iter(judge.states.values()), None)
            if state is not None and state.detector is not None and state.detector.get("homogeneous"):
                return w * WINDOW / 60
    return None


def false_rejections(seeds: int) -> list[dict[str, Any]]:
    rule = detect()
    rows = []
    for load in LOADS:
        for heavy in (False, True):
            for k in (3, 5):
                started = time.monotonic()
                rejected, ratios, seconds = [], [], []
                for seed in range(seeds):
                    traffic = Traffic(np.random.default_rng(seed), k, LOADS[load], heavy=heavy)
                    windows = windows_of(traffic.windows(np.full(HOUR, 0.75)))
                    began = time.perf_counter()
                    result = examine(rule, windows)
                    seconds.append(time.perf_counter() - began)
                    assert result is not None
                    ratios.append(result.evidence / result.threshold)
                    if not result.homogeneous:
                        rejected.append(seed)
                delays = [asyncio.run(calibrated_after(seed, k, load, heavy)) for seed in rejected]
                rows.append(
                    {
                        "load": load, "heavy": heavy, "k": k, "seeds": seeds, "rejected": len(rejected),
                        "p99": float(np.percentile(ratios, 99)), "largest": max(ratios), "delays": delays,
                        "ms": 1000 * statistics.median(seconds), "took": time.monotonic() - started,
                    }
                )  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def shifts_found(seeds: int) -> list[dict[str, Any]]:
    rule = detect()
    rows = []
    for name, levels_of in SCENARIOS.items():
        for load in ("16 requests", "4 requests"):
            found = 0
            for seed in range(seeds):
                rng = np.random.default_rng(10_000 + seed)
                traffic = Traffic(rng, 3, LOADS[load])
                result = examine(rule, windows_of(traffic.windows(levels_of(rng))))
                found += result is not None and not result.homogeneous
            rows.append({"scenario": name, "load": load, "seeds": seeds, "found": found})
            print(rows[-1], flush=True)
    return rows


def report(fr: list[dict[str, Any]], sf: list[dict[str, Any]], took: float) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    # What the figures depend on: this file, the traffic it draws, the check and the detector.
    paths = [
        "benchmarks/bench_warmup_homogeneity.py", "benchmarks/collapse_traffic.py", "benchmarks/collapse_rules.py",
        "common/homogeneity.py", "common/sequential.py", "engine/warmup.py", "engine/detection.py",
        "engine/detector_state.py", "daemon/evaluation.py", "daemon/readings.py", "rules",
    ]  # fmt: skip
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True, check=False
    )
    measured = (commit.stdout.strip() or "?") + (" with uncommitted changes" if dirty.stdout.strip() else "")
    total = sum(r["seeds"] for r in fr)
    rejected = sum(r["rejected"] for r in fr)
    lines = [
        "# The collapse detector's warm-up check",
        "",
        f"{datetime.now(UTC):%a %b %d %H:%M:%S UTC %Y}, commit {measured}. "
        f"Python {platform.python_version()}, {platform.machine()}; {took:.0f} s in all.",
        "",
        "The shipped `acceptance_collapse` (5 s windows, a warm-up of 720, drops 0.12 and 0.3) on the collapse",
        "benchmark's traffic model (`benchmarks/collapse_traffic.py`): requests in flight, each",
        "with its own acceptance (a Beta of spread 0.1 around the level) and lasting 30 s on average,",
        "geometric or lognormal (sd of log 1.5); chain drafts of k tokens.",
        "",
        "## False rejections: healthy hours at 0.75",
        "",
        "Rejected: hours the check held back. G / h: the largest CUSUM of the check over its threshold",
        "(1 rejects), 99th percentile and largest. Calibrated after: when the detector itself, sliding",
        "on, calibrated on each rejected seed's traffic (minutes from its first window; 60 had it not",
        "been held back).",
        "",
        "| load | request lengths | k | hours | rejected | G / h p99 | G / h largest | calibrated after | check, median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fr:
        after = ", ".join("-" if d is None else f"{d:.0f} min" for d in r["delays"]) or "-"
        lines.append(
            f"| {r['load']} | {'lognormal' if r['heavy'] else 'geometric'} | {r['k']} | {r['seeds']} "
            f"| {r['rejected']} ({100 * r['rejected'] / r['seeds']:.2f} %) | {r['p99']:.2f} | {r['largest']:.2f} "
            f"| {after} | {r['ms']:.1f} ms |"
        )
    lines += [
        "",
        f"In all: {rejected} of {total} healthy hours held back ({100 * rejected / total:.2f} %).",
        "",
        "## Shifts found inside the hour (k = 3)",
        "",
        "The rest of the hour at 0.75. A few minutes at another level start at a random moment; a step",
        "holds from the middle of the hour (or for its first 40 minutes) to its end.",
        "",
        "| inside the hour | load | hours | found |",
        "|---|---|---|---|",
    ]
    for r in sf:
        lines.append(
            f"| {r['scenario']} | {r['load']} | {r['seeds']} | {r['found']} ({100 * r['found'] / r['seeds']:.0f} %) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=500, help="healthy hours per setting (default 500)")
    parser.add_argument("--shift-seeds", type=int, default=100, help="hours per shift scenario (default 100)")
    parser.add_argument("--write", type=Path, help="write the report here (markdown)")
    args = parser.parse_args()
    started = time.monotonic()
    fr = false_rejections(args.seeds)
    sf = shifts_found(args.shift_seeds)
    text = report(fr, sf, time.monotonic() - started)
    print(text)
    if args.write is not None:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
