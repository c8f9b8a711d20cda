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
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.collapse_report import dispersion_report, report
from benchmarks.collapse_rules import (
    SHIPPED,
    Judge,
    Variant,
    detector_answer,
    playbook_answer,
    rules,
    warmup_windows,
    window_of,
)
from benchmarks.collapse_traffic import IN_CONTROL, LOADS, WINDOW, Traffic

PLAYBOOK_WINDOW = 60.0  # the playbook rule's window and interval
DAY = 86400.0
CAUGHT_WITHIN = 600.0


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


VARIANTS = (
    SHIPPED,
    Variant("the CUSUM alone (single_window: false)", single_window=False),
    Variant("interval 2.5 s", interval=2.5),
    Variant("interval 10 s", interval=10.0),
    Variant("drop [0.12, 0.35]", drop=(0.12, 0.35)),
)


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
