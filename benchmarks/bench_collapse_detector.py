"""The collapse detector against the playbook's rule, in accelerated time: detection delay and false
alarms, side by side in one run.

Both rules are the shipped pack's (``builtin:speculative``): ``acceptance_collapse`` (a CUSUM on
token_acceptance, one 5 s window per evaluation) and ``acceptance_fallback`` (acceptance_rate below
0.4 in three 60 s evaluations in a row). Each goes through specguard's own evaluation and engine
(``daemon.evaluation.evaluate_rule``: pure, the clock passed in), fed windows generated from the
simulator's model instead of waiting for them:

- 32, 16 or 4 requests in flight; each lasts 30 s on average and drafts a Poisson number of times
  per window (10 verification steps a second); how long a request lasts is geometric (a request
  ends in each window with the same probability, as ``sim.model.natural_length`` ends one at each
  token), or in a heavy-tailed scenario lognormal (most requests short, a few very long);
- each request's own acceptance is the configured level times a factor drawn when it starts
  (``request_factors``: ``sim.model.request_factor``'s law, a Beta of mean 0.75 and spread 0.1,
  ``--acceptance-spread 0.1``); a draft of k tokens is accepted position by position until the first
  rejection (``accepted_tokens``: ``sim.model.sample_accepted``'s law). Both are drawn many at a
  time with numpy; ``tests/unit/daemon/test_collapse_bench_traffic.py`` checks them against ``sim.model``.

Scenarios, at k = 3 and 5: 30 days of stationary traffic at 0.75 (false alarms), with geometric and
with lognormal request lengths, and 50 runs each of a drop from 0.75 to 0.45 and to 0.62 at a random
moment, after the detector's warm-up (delay from the drop to the firing; "caught": fired within 10
minutes of the drop). Targets: median delay at most 20 s for the large drop, the subtle one caught
(within 10 minutes) in at least 95 % of runs, at most one false alarm in 30 days. Then the shipped
rule's settings varied (interval, levels) at 16 requests, for the large drop's delay, and what a
single window holds: the lowest in-control window of the 30 days against the first whole window
after a collapse.

Run (about 12 minutes on one core):
    .venv/bin/python benchmarks/bench_collapse_detector.py [--write benchmarks/results/collapse_detector.md]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specguard.config.loading import LoadedRule
from specguard.config.loading import load as load_config
from specguard.daemon.evaluation import evaluate_rule
from specguard.rules.signals import Signal
from specguard.sim.model import beta_parameters
from specguard.sources.base import Series, SourceResult
from specguard.store.records import SeriesState, State

WINDOW = 5.0  # the shipped detector's interval, a window per evaluation
PLAYBOOK_WINDOW = 60.0  # the playbook rule's window and interval
STEPS_PER_SECOND = 10.0  # drafts a request makes a second (Poisson)
MEAN_LIFE = 30.0  # seconds a request lasts, on average
HEAVY_SIGMA = 1.5  # the lognormal's sd of log: median 10 s, 1 in 100 over 5 minutes, same mean
SPREAD = 0.1  # sd of a request's own acceptance
LOADS = {"32 requests": 32, "16 requests": 16, "4 requests": 4}  # in flight
IN_CONTROL = 0.75
DAY = 86400.0
LABELS = {"instance": "vllm-a:8000", "model_name": "m"}
CAUGHT_WITHIN = 600.0


def request_factors(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Each request's acceptance over the configured level, ``sim.model.request_factor``'s law: its
    own level drawn from a Beta of mean IN_CONTROL and spread SPREAD, over IN_CONTROL."""
    a, b = beta_parameters(IN_CONTROL, SPREAD)
    return rng.beta(a, b, shape) / IN_CONTROL


def accepted_tokens(rng: np.random.Generator, alpha: np.ndarray, k: int) -> np.ndarray:
    """Accepted tokens of one chain draft of k tokens per entry of ``alpha``:
    ``sim.model.sample_accepted``'s law for the conditional acceptances ``[alpha] * k`` (positions
    tried in order until the first rejection), a geometric number of successes capped at k. The
    simulator caps level x factor at 1, as this does."""
    p_reject = 1.0 - np.minimum(alpha, 1.0 - 1e-12)
    return np.minimum(rng.geometric(p_reject) - 1, k)


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

    def __init__(
        self, rng: np.random.Generator, k: int, slots: int, window: float = WINDOW, heavy: bool = False
    ) -> None:
        self.rng, self.k, self.slots, self.heavy = rng, k, slots, heavy
        self.life = MEAN_LIFE / window  # in windows
        self.drafts = STEPS_PER_SECOND * window
        self.factors = request_factors(rng, slots)
        self.remaining = self._lives(slots)

    def _lives(self, n: int) -> np.ndarray:
        """Windows each of ``n`` new requests lasts (heavy: lognormal of mean ``life``, at least 1)."""
        if not self.heavy:
            return np.zeros(n)  # unused: a geometric life is a coin tossed every window
        mu = math.log(self.life) - HEAVY_SIGMA**2 / 2
        return np.maximum(1.0, np.round(self.rng.lognormal(mu, HEAVY_SIGMA, n)))

    def starts(self, n: int) -> np.ndarray:
        """(n, slots): whether a new request takes the slot at each of the next n windows."""
        if not self.heavy:
            return self.rng.random((n, self.slots)) < 1.0 / self.life
        starts = np.zeros((n, self.slots), dtype=bool)
        for w in range(n):
            self.remaining -= 1
            ended = self.remaining <= 0
            if ended.any():
                starts[w] = ended
                self.remaining[ended] = self._lives(int(ended.sum()))
        return starts

    def windows(
        self, levels: np.ndarray, cut: np.ndarray | None = None, after: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Counts of ``len(levels)`` windows, window w at acceptance level ``levels[w]`` (times each
        request's factor); ``cut[w]``: the share of window w's drafts made before the level
        became ``after[w]`` (a drop in the middle of a window, the same requests on both sides)."""
        n = len(levels)
        rng, slots = self.rng, self.slots
        new = self.starts(n)
        draws = request_factors(rng, (n, slots))
        index = np.where(new, np.arange(n)[:, None], -1)
        index = np.maximum.accumulate(index, axis=0)
        factors = np.where(index >= 0, draws[np.clip(index, 0, None), np.arange(slots)], self.factors)
        self.factors = factors[-1]
        parts = [(levels, np.ones(n) if cut is None else cut)]
        if cut is not None and after is not None:
            parts.append((after, 1.0 - cut))
        window_of_cell = np.repeat(np.arange(n), slots)
        accepted_sum, drafts_sum, whole_sum = np.zeros(n), np.zeros(n), np.zeros(n)
        for level, share in parts:
            drafts = rng.poisson(self.drafts * np.broadcast_to(share[:, None], (n, slots)))
            alpha = level[:, None] * factors
            accepted = accepted_tokens(rng, np.repeat(alpha.ravel(), drafts.ravel()), self.k)
            cells = np.repeat(window_of_cell, drafts.ravel())
            accepted_sum += np.bincount(cells, weights=accepted, minlength=n)
            whole_sum += np.bincount(cells, weights=(accepted == self.k), minlength=n)
            drafts_sum += drafts.sum(axis=1)
        return {
            "accepted": accepted_sum,
            "drafts": drafts_sum,
            "failures": drafts_sum - whole_sum,
            "draft_tokens": drafts_sum * self.k,
        }


def detector_answer(accepted: float, failures: float) -> SourceResult:
    trials = accepted + failures
    if trials <= 0:
        return SourceResult()
    return SourceResult(series=(Series(dict(LABELS), accepted / trials, trials),))


def playbook_answer(accepted: float, draft_tokens: float) -> SourceResult:
    return SourceResult.of([(LABELS, accepted / draft_tokens)]) if draft_tokens > 0 else SourceResult()


@dataclass(frozen=True)
class Variant:
    """The shipped detector rule, or one of its settings changed."""

    name: str = "shipped"
    interval: float | None = None
    drop: tuple[float, ...] | None = None
    phi: float | None = None  # a fixed dispersion instead of the warm-up's
    single_window: bool | None = None  # the window test on or off


SHIPPED = Variant()


def rules(variant: Variant = SHIPPED) -> tuple[LoadedRule, LoadedRule]:
    loaded = load_config(None)
    by_name = {item.name: item for item in loaded.enabled_rules()}
    detector, playbook = by_name["acceptance_collapse"], by_name["acceptance_fallback"]
    rule, detect = detector.rule, detector.rule.detect
    assert detect is not None
    if variant.drop is not None:
        detect = detect.model_copy(update={"drop": list(variant.drop)})
    if variant.phi is not None:
        detect = detect.model_copy(update={"phi": variant.phi})
    if variant.single_window is not None:
        detect = detect.model_copy(update={"single_window": variant.single_window})
    if variant != SHIPPED:
        changed = rule.model_copy(update={"interval": variant.interval or rule.interval, "detect": detect})
        detector = replace(detector, rule=changed)
    return detector, playbook


def window_of(item: LoadedRule) -> float:
    return item.rule.interval or WINDOW


async def play(
    traffic: Traffic, levels: np.ndarray, detector: Judge, playbook: Judge,
    drop: tuple[int, float, float] | None = None, stop_after: float | None = None,
    seen: list[float] | None = None,
) -> None:  # fmt: skip
    """Evaluate both rules over the windows at ``levels``; ``drop = (w, f, level after)``: window w
    is cut at f, its first part at ``levels[w]``, the rest at the level after. ``stop_after``: stop
    once both rules fired, or 10 minutes after this moment. ``seen``: every window's α̂ is added."""
    window = window_of(detector.item)
    playbook_every = round(PLAYBOOK_WINDOW / window)
    chunk = 2000
    pending: list[tuple[float, float]] = []  # the playbook window's (accepted, draft tokens) so far
    for begin in range(0, len(levels), chunk):
        part = levels[begin : begin + chunk]
        cut, after = np.ones(len(part)), part.copy()
        if drop is not None and begin <= drop[0] < begin + len(part):
            cut[drop[0] - begin], after[drop[0] - begin] = drop[1], drop[2]
        counts = traffic.windows(part, cut, after)
        for w_local in range(len(part)):
            w = begin + w_local
            accepted, failures = counts["accepted"][w_local], counts["failures"][w_local]
            tokens = counts["draft_tokens"][w_local]
            now = (w + 1) * window
            await detector.evaluate(detector_answer(accepted, failures), now)
            if seen is not None and accepted + failures > 0:
                seen.append(accepted / (accepted + failures))
            pending.append((accepted, tokens))
            if (w + 1) % playbook_every == 0:
                await playbook.evaluate(
                    playbook_answer(sum(a for a, _ in pending), sum(t for _, t in pending)), now
                )
                pending = []
            if stop_after is not None and detector.fired and playbook.fired:
                return
            if stop_after is not None and now - stop_after > CAUGHT_WITHIN:
                return


def warmup_windows(item: LoadedRule) -> int:
    detect = item.rule.detect
    assert detect is not None
    return math.ceil(detect.warmup / window_of(item))


async def false_alarms(
    k: int, load: str, days: int, seed: int, heavy: bool = False, variant: Variant = SHIPPED
) -> dict[str, Any]:
    detector_rule, playbook_rule = rules(variant)
    traffic = Traffic(np.random.default_rng(seed), k, LOADS[load], heavy=heavy)
    detector, playbook = Judge(detector_rule), Judge(playbook_rule)
    warm = warmup_windows(detector_rule)
    started = time.monotonic()
    seen: list[float] = []
    await play(traffic, np.full(warm + int(days * DAY / WINDOW), IN_CONTROL), detector, playbook, seen=seen)
    state = next(iter(detector.states.values()))
    assert state.detector is not None
    return {
        "k": k,
        "load": load,
        "days": days,
        "heavy": heavy,
        "detector": len(detector.fired),
        "playbook": len(playbook.fired),
        "phi": state.detector["phi"],
        "window_phi": _window_phi(state.detector),
        "alpha0": state.detector["alpha0"],
        "lowest": min(seen[warm:]),
        "seconds": time.monotonic() - started,
    }


def _window_phi(detector: dict[str, Any]) -> float:
    from specguard.common.sequential import Dispersion

    value = Dispersion.from_json(detector["warmup"]).window_phi
    return value if value is not None else math.nan


async def one_drop(
    k: int, load: str, to: float, seed: int, variant: Variant = SHIPPED
) -> tuple[float | None, float | None, float, int, int, float]:
    """(detector delay, playbook delay, phi, detector and playbook firings before the drop, α̂ of
    the first whole window after it) of one run; a delay is None when not caught within 10
    minutes."""
    detector_rule, playbook_rule = rules(variant)
    window = window_of(detector_rule)
    rng = np.random.default_rng(seed)
    traffic = Traffic(rng, k, LOADS[load], window=window)
    detector, playbook = Judge(detector_rule), Judge(playbook_rule)
    warm = warmup_windows(detector_rule)
    before = warm + int(rng.integers(30, 90) * WINDOW / window)  # in-control windows, then the drop
    fraction = float(rng.random())
    drop_at = (before + fraction) * window
    after = int(CAUGHT_WITHIN / window) + 2
    levels = np.concatenate([np.full(before + 1, IN_CONTROL), np.full(after, to)])
    seen: list[float] = []
    await play(traffic, levels, detector, playbook, (before, fraction, to), drop_at, seen)
    phi = next(iter(detector.states.values())).detector or {}

    def delay(fired: Sequence[float]) -> float | None:
        late = [t - drop_at for t in fired if t > drop_at]
        return late[0] if late and late[0] <= CAUGHT_WITHIN else None

    def early(fired: Sequence[float]) -> int:  # false alarms, in control before the drop
        return len([t for t in fired if t <= drop_at])

    return (
        delay(detector.fired), delay(playbook.fired), float(phi.get("phi") or 0.0),
        early(detector.fired), early(playbook.fired), seen[before + 1],
    )  # fmt: skip


async def drops(
    k: int, load: str, to: float, runs: int, seed: int, variant: Variant = SHIPPED
) -> dict[str, Any]:
    started = time.monotonic()
    results = [await one_drop(k, load, to, seed * 1000 + run, variant) for run in range(runs)]
    out: dict[str, Any] = {
        "k": k,
        "load": load,
        "to": to,
        "runs": runs,
        "variant": variant.name,
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
    out["first_window_highest"] = max(r[5] for r in results)
    return out


def dispersion_by_scale(k: int, load: str, heavy: bool, days: int, seed: int) -> dict[str, Any]:
    """What phi should be, against what a warm-up learns: Pearson's dispersion of sums over 2, 5
    and 10 minutes of in-control traffic (``days`` of it), and the phi of one-hour warm-ups every
    two hours of the same traffic."""
    from specguard.common.sequential import Dispersion

    traffic = Traffic(np.random.default_rng(seed), k, LOADS[load], heavy=heavy)
    n = int(days * DAY / WINDOW)
    parts = [traffic.windows(np.full(min(4000, n - b), IN_CONTROL)) for b in range(0, n, 4000)]
    s = np.concatenate([c["accepted"] for c in parts])
    trials = s + np.concatenate([c["failures"] for c in parts])

    def blocks(size: int, start: int = 0, end: int | None = None) -> Dispersion:
        window_s, window_n = s[start:end], trials[start:end]
        m = len(window_s) // size
        d = Dispersion()
        for a, b in zip(
            window_s[: m * size].reshape(m, size).sum(1),
            window_n[: m * size].reshape(m, size).sum(1),
            strict=True,
        ):
            d.add(float(a), float(b), follows=size == 1)
        return d

    hour = int(3600 / WINDOW)
    learned = [blocks(1, h, h + hour).phi for h in range(0, n - hour, 2 * hour)]
    return {
        "k": k, "load": load, "heavy": heavy, "days": days,
        "by_minutes": {m: blocks(int(m * 60 / WINDOW)).window_phi for m in (2, 5, 10)},
        "warmups": len(learned),
        "learned": [float(np.percentile([x for x in learned if x], q)) for q in (10, 50, 90)],
    }  # fmt: skip


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


VARIANTS = (
    SHIPPED,
    Variant("the CUSUM alone (single_window: false)", single_window=False),
    Variant("interval 2.5 s", interval=2.5),
    Variant("interval 10 s", interval=10.0),
    Variant("drop [0.12, 0.35]", drop=(0.12, 0.35)),
)


def report(
    fa: list[dict[str, Any]], dr: list[dict[str, Any]], sweep: list[dict[str, Any]], took: float
) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    # What the figures depend on: this file, the evaluation path it drives, the model it draws from.
    measured_path = [
        "benchmarks/bench_collapse_detector.py", "daemon/evaluation.py", "daemon/readings.py",
        "engine/detection.py", "engine/detector_state.py", "engine/states.py", "config/loading.py",
        "common/sequential.py", "rules", "sim/model.py",
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


async def main(args: argparse.Namespace) -> None:
    if args.dispersion:
        rows = [
            dispersion_by_scale(5, load, heavy, 8, seed=17)
            for heavy in (False, True)
            for load in ("16 requests", "4 requests")
        ]
        print(dispersion_report(rows))
        return
    started = time.monotonic()
    fa = []
    scenarios = [(load, k, False) for load in LOADS for k in (3, 5)]
    scenarios += [("16 requests", 3, True), ("16 requests", 5, True), ("4 requests", 5, True)]
    for load, k, heavy in scenarios:
        fa.append(await false_alarms(k, load, args.days, seed=k + 100 * len(fa), heavy=heavy))
        print(fa[-1], flush=True)
    dr = []
    for load in LOADS:
        for k in (3, 5):
            for to in (0.45, 0.62):
                row = await drops(k, load, to, args.runs, seed=k * 10 + int(to * 100) + 1000 * len(dr))
                print(row, flush=True)
                dr.append(row)
    sweep = []
    for variant in VARIANTS:
        for k in (3, 5):
            row = await drops(k, "16 requests", 0.45, args.runs, seed=k * 10 + 45 + 7000, variant=variant)
            print(row, flush=True)
            sweep.append(row)
    text = report(fa, dr, sweep, time.monotonic() - started)
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
    parser.add_argument(
        "--dispersion",
        action="store_true",
        help="only the dispersion of in-control traffic by time scale against what warm-ups learn",
    )
    asyncio.run(main(parser.parse_args()))
