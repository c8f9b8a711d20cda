"""The collapse detector against the playbook's rule, in accelerated time: detection delay and false
alarms, side by side in one run.

Both rules are the shipped pack's (``builtin:speculative``): ``acceptance_collapse`` (a CUSUM on
token_acceptance, one 5 s window per evaluation) and ``acceptance_fallback`` (acceptance_rate below
0.4 in three 60 s evaluations in a row). Each goes through specguard's own evaluation and engine
(``daemon.evaluation.evaluate_rule``: pure, the clock passed in), fed windows generated from the
simulator's model instead of waiting for them:

- 32, 16 or 4 requests in flight; each lasts a geometric number of 5 s windows (mean 6: 30 s) and drafts a
  Poisson number of times per 5 s window (mean 50: 10 verification steps a second);
- each request's own acceptance is the configured level times a factor drawn when it starts, a Beta
  of mean 1 and spread 0.1 / 0.75 (``sim.model.request_factor``'s law, ``--acceptance-spread
  0.1``); a draft of k tokens is accepted position by position until the first rejection.

Scenarios, at k = 3 and 5: 30 days of stationary traffic at 0.75 (false alarms), and 50 runs each of
a drop from 0.75 to 0.45 and to 0.62 at a random moment, after the detector's warm-up (delay from
the drop to the firing; "caught" within 10 minutes). Targets: median delay at most 20 s for the
large drop, the subtle one caught in at least 95 % of runs, at most one false alarm in 30 days.

Run:
    .venv/bin/python benchmarks/bench_collapse_detector.py [--write benchmarks/results/collapse_detector.md]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon.engine import SeriesState, State
from daemon.evaluation import evaluate_rule
from daemon.loading import LoadedRule
from daemon.loading import load as load_config
from daemon.sources.base import Series, SourceResult
from rules.signals import Signal
from sim.model import beta_parameters

WINDOW = 5.0  # the detector's interval, a window per evaluation
PLAYBOOK_EVERY = 12  # its 60 s window and interval, in detector windows
DRAFTS, LIFE, SPREAD = 50.0, 6.0, 0.1  # a request: 50 drafts a 5 s window, 30 s on average
LOADS = {"32 requests": 32, "16 requests": 16, "4 requests": 4}  # in flight
IN_CONTROL = 0.75
DAY = 17280  # windows
LABELS = {"instance": "vllm-a:8000", "model_name": "m"}
CAUGHT_WITHIN = 600.0


class Answer:
    """A source whose answer the benchmark sets before each evaluation."""

    kind = "scrape"

    def __init__(self) -> None:
        self.result = SourceResult()

    async def refresh(self) -> None:
        return None

    async def query_signal(self, signal: Signal, *_: Any, **__: Any) -> SourceResult:
        return self.result

    async def query_expr(self, expr: str) -> SourceResult:
        raise AssertionError(expr)

    async def close(self) -> None:
        return None


@dataclass
class Judge:
    """One rule, evaluated on its own schedule, its states carried along."""

    item: LoadedRule
    source: Answer = field(default_factory=Answer)
    states: dict[str, SeriesState] = field(default_factory=dict)
    fired: list[float] = field(default_factory=list)

    async def evaluate(self, result: SourceResult, now: float) -> None:
        self.source.result = result
        interval = self.item.rule.interval or WINDOW
        outcome, _ = await evaluate_rule(self.item, self.source, None, self.states, now, interval)  # type: ignore[arg-type]
        self.states = outcome.states
        self.fired += [e.at for e in outcome.events if e.kind is State.FIRING]


class Traffic:
    """Windows of vLLM's counters from the simulator's model, a chunk at a time."""

    def __init__(self, rng: np.random.Generator, k: int, slots: int) -> None:
        self.rng, self.k, self.slots = rng, k, slots
        a, b = beta_parameters(IN_CONTROL, SPREAD)
        self.a, self.b = a, b
        self.factors = rng.beta(a, b, slots) / IN_CONTROL

    def windows(self, levels: np.ndarray, share: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Counts of ``len(levels)`` windows, window w at acceptance level ``levels[w]`` (times each
        request's factor); ``share``: the part of each window's drafts drawn (a window cut in two)."""
        n = len(levels)
        rng, slots = self.rng, self.slots
        new = rng.random((n, slots)) < 1.0 / LIFE
        draws = rng.beta(self.a, self.b, (n, slots)) / IN_CONTROL
        index = np.where(new, np.arange(n)[:, None], -1)
        index = np.maximum.accumulate(index, axis=0)
        factors = np.where(index >= 0, draws[np.clip(index, 0, None), np.arange(slots)], self.factors)
        self.factors = factors[-1]
        alpha = np.clip(levels[:, None] * factors, 0.0, 0.999)
        mean = DRAFTS * (share[:, None] if share is not None else 1.0)
        drafts = rng.poisson(np.broadcast_to(mean, (n, slots)))
        flat_alpha = np.repeat(alpha.ravel(), drafts.ravel())
        accepted = np.minimum(rng.geometric(1.0 - flat_alpha) - 1, self.k)
        cells = np.repeat(np.arange(n * slots), drafts.ravel())
        per_cell = np.bincount(cells, weights=accepted, minlength=n * slots).reshape(n, slots)
        whole = np.bincount(cells, weights=(accepted == self.k), minlength=n * slots).reshape(n, slots)
        d = drafts.sum(axis=1).astype(float)
        s = per_cell.sum(axis=1)
        return {"accepted": s, "drafts": d, "failures": d - whole.sum(axis=1), "draft_tokens": d * self.k}


def detector_answer(accepted: float, failures: float) -> SourceResult:
    trials = accepted + failures
    if trials <= 0:
        return SourceResult()
    return SourceResult(series=(Series(dict(LABELS), accepted / trials, trials),))


def playbook_answer(accepted: float, draft_tokens: float) -> SourceResult:
    return SourceResult.of([(LABELS, accepted / draft_tokens)]) if draft_tokens > 0 else SourceResult()


def rules() -> tuple[LoadedRule, LoadedRule]:
    loaded = load_config(None)
    by_name = {item.name: item for item in loaded.enabled_rules()}
    return by_name["acceptance_collapse"], by_name["acceptance_fallback"]


async def play(
    traffic: Traffic, levels: np.ndarray, start_window: int, detector: Judge, playbook: Judge,
    share: dict[int, tuple[float, float]] | None = None, stop_when_both: float | None = None,
) -> None:  # fmt: skip
    """Evaluate both rules over the windows at ``levels``; ``share[w] = (f, level after)``: window w
    is cut at f, its first part at ``levels[w]``, the rest at the level after."""
    chunk = 2000
    pending: list[tuple[float, float]] = []  # the playbook window's (accepted, draft tokens) so far
    for begin in range(0, len(levels), chunk):
        part = levels[begin : begin + chunk]
        counts = traffic.windows(part)
        for w_local in range(len(part)):
            w = begin + w_local
            accepted, failures = counts["accepted"][w_local], counts["failures"][w_local]
            tokens = counts["draft_tokens"][w_local]
            if share and w in share:
                fraction, after = share[w]
                first = traffic.windows(np.array([levels[w]]), np.array([fraction]))
                second = traffic.windows(np.array([after]), np.array([1 - fraction]))
                accepted = first["accepted"][0] + second["accepted"][0]
                failures = first["failures"][0] + second["failures"][0]
                tokens = first["draft_tokens"][0] + second["draft_tokens"][0]
            now = (start_window + w + 1) * WINDOW
            await detector.evaluate(detector_answer(accepted, failures), now)
            pending.append((accepted, tokens))
            if (start_window + w + 1) % PLAYBOOK_EVERY == 0:
                await playbook.evaluate(
                    playbook_answer(sum(a for a, _ in pending), sum(t for _, t in pending)), now
                )
                pending = []
            if stop_when_both is not None and detector.fired and playbook.fired:
                return
            if stop_when_both is not None and now - stop_when_both > CAUGHT_WITHIN:
                return


def warmup_windows(item: LoadedRule) -> int:
    detect = item.rule.detect
    assert detect is not None
    return int(detect.warmup / WINDOW)


async def false_alarms(k: int, load: str, days: int, seed: int) -> dict[str, Any]:
    detector_rule, playbook_rule = rules()
    traffic = Traffic(np.random.default_rng(seed), k, LOADS[load])
    detector, playbook = Judge(detector_rule), Judge(playbook_rule)
    warm = warmup_windows(detector_rule)
    started = time.monotonic()
    await play(traffic, np.full(warm + days * DAY, IN_CONTROL), 0, detector, playbook)
    state = next(iter(detector.states.values()))
    assert state.detector is not None
    return {
        "k": k,
        "load": load,
        "days": days,
        "detector": len(detector.fired),
        "playbook": len(playbook.fired),
        "phi": state.detector["phi"],
        "alpha0": state.detector["alpha0"],
        "seconds": time.monotonic() - started,
    }


async def one_drop(
    k: int, load: str, to: float, seed: int
) -> tuple[float | None, float | None, float, int, int]:
    """(detector delay, playbook delay, phi, detector and playbook firings before the drop) of one
    run; a delay is None when not caught within 10 minutes."""
    detector_rule, playbook_rule = rules()
    rng = np.random.default_rng(seed)
    traffic = Traffic(rng, k, LOADS[load])
    detector, playbook = Judge(detector_rule), Judge(playbook_rule)
    warm = warmup_windows(detector_rule)
    before = warm + int(rng.integers(30, 90))  # in-control windows, then the drop
    fraction = float(rng.random())
    drop_at = (before + fraction) * WINDOW
    after = int(CAUGHT_WITHIN / WINDOW) + 2
    levels = np.concatenate([np.full(before + 1, IN_CONTROL), np.full(after, to)])
    await play(traffic, levels, 0, detector, playbook, {before: (fraction, to)}, drop_at)
    phi = next(iter(detector.states.values())).detector or {}

    def delay(fired: Sequence[float]) -> float | None:
        late = [t - drop_at for t in fired if t > drop_at]
        return late[0] if late and late[0] <= CAUGHT_WITHIN else None

    def early(fired: Sequence[float]) -> int:  # false alarms, in control before the drop
        return len([t for t in fired if t <= drop_at])

    return (
        delay(detector.fired), delay(playbook.fired), float(phi.get("phi") or 0.0),
        early(detector.fired), early(playbook.fired),
    )  # fmt: skip


async def drops(k: int, load: str, to: float, runs: int, seed: int) -> dict[str, Any]:
    started = time.monotonic()
    results = [await one_drop(k, load, to, seed * 1000 + run) for run in range(runs)]
    out: dict[str, Any] = {
        "k": k,
        "load": load,
        "to": to,
        "runs": runs,
        "seconds": time.monotonic() - started,
    }
    for index, name in ((0, "detector"), (1, "playbook")):
        delays = [r[index] for r in results if r[index] is not None]
        out[name] = {
            "caught": len(delays),
            "median": statistics.median(delays) if delays else None,
            "p90": sorted(delays)[max(0, int(0.9 * len(delays)) - 1)] if delays else None,
        }
        out[name]["early"] = sum(r[3 + index] for r in results)
    out["phi"] = statistics.median(r[2] for r in results)
    return out


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def report(fa: list[dict[str, Any]], dr: list[dict[str, Any]], took: float) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    detector_rule, _ = rules()
    detect = detector_rule.rule.detect
    assert detect is not None
    lines = [
        "# The collapse detector against the playbook's rule (accelerated time)",
        "",
        f"{datetime.now(UTC):%a %b %d %H:%M:%S UTC %Y}, commit {commit.stdout.strip() or '?'}. "
        f"Python {platform.python_version()}, {platform.machine()}; {took:.0f} s in all.",
        "",
        "Traffic: 32, 16 or 4 requests in flight, each for a geometric number of 5 s windows (mean",
        "6: 30 s), 50 drafts a window each (Poisson: 10 steps a second); a request's acceptance is",
        "the level times its own factor, a Beta of spread 0.1 around 0.75 (`sim.model.request_factor`,",
        "`--acceptance-spread 0.1`); chain drafts of k tokens. Both rules are the shipped pack's,",
        "evaluated by `daemon.evaluation` on a simulated clock:",
        f"`acceptance_collapse` ({detect.describe()}; every 5 s, warm-up {detect.warmup / 60:.0f} min,",
        f"at most one false alarm per {detect.false_alarm_every / 86400:.0f} days by Lorden's bound) and",
        "`acceptance_fallback` (acceptance_rate < 0.4 in three 60 s evaluations in a row).",
        "",
    ]
    lines += [
        "## False alarms, stationary traffic at 0.75",
        "",
        "| load | k | days | acceptance_collapse | acceptance_fallback | phi (warm-up) | alpha0 learned |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in fa:
        lines.append(
            f"| {row['load']} | {row['k']} | {row['days']} | {row['detector']} | {row['playbook']} "
            f"| {row['phi']:.1f} | {row['alpha0']:.3f} |"
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
    big = [r for r in dr if r["to"] == 0.45]
    subtle = [r for r in dr if r["to"] == 0.62]
    lines += [
        "",
        "## Targets",
        "",
        "- median delay for 0.75 -> 0.45 at most 20 s: "
        + ", ".join(f"{r['load']} k={r['k']} {_s(r['detector']['median'])}" for r in big),
        "- 0.75 -> 0.62 caught in at least 95 % of runs: "
        + ", ".join(
            f"{r['load']} k={r['k']} {100 * r['detector']['caught'] / r['runs']:.0f} %" for r in subtle
        ),
        "- at most one false alarm in 30 days: "
        + ", ".join(f"{r['load']} k={r['k']} {r['detector']}" for r in fa),
    ]
    return "\n".join(lines) + "\n"


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    fa = []
    for load in LOADS:
        for k in (3, 5):
            fa.append(await false_alarms(k, load, args.days, seed=k + 100 * len(fa)))
            print(fa[-1], flush=True)
    dr = []
    for load in LOADS:
        for k in (3, 5):
            for to in (0.45, 0.62):
                row = await drops(k, load, to, args.runs, seed=k * 10 + int(to * 100) + 1000 * len(dr))
                print(row, flush=True)
                dr.append(row)
    text = report(fa, dr, time.monotonic() - started)
    print(text)
    if args.write:
        Path(args.write).write_text(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--write", metavar="FILE")
    asyncio.run(main(parser.parse_args()))
