"""What ``specguard backtest`` costs: a week of 8 servers' history replayed for the shipped rule pack.

Target: a week of 8 servers replayed for the shipped rule pack in under 10 s.

History: ``benchmarks/backtest_history.py``, in a process of its own (its time and peak RSS are
reported apart, not measured with the replay): 8 simulated vLLM servers (``tests/week.py``'s
``Timeline``; model-a with k = 3 on vllm-0..3, model-b with k = 5 on vllm-4..7; a daily cycle of
load and acceptance) scraped once a minute from 30 minutes before the period, each page parsed and
recorded through ``store.history.record`` into a real SQLite file in a temporary directory, as the
daemon's history job records. Incidents: vllm-1's draft collapses on Tuesday 14:00-15:00 (per-token
acceptance 0.25), vllm-6 runs with its KV cache full on Thursday 13:00-15:00 (0.97, preempting, 1.6
times slower). The config: ``rules.yaml``, the shipped pack's eight rules as
``rules/packs/speculative.yaml`` has them, but with ``actions: [log, fallback]`` on
acceptance_fallback and acceptance_collapse, ``fallback`` a file feature flag (quiet period 10 m);
a baseline file whose e2e p95 and mean per model are the generator's ground truth outside the
incidents (model-a: a draft model, ``draft_cost`` 0.15; model-b: an EAGLE-3 head), so that the
latency and speedup rules evaluate.

Measured, in one process: ``backtest.run.backtest(loaded, start, end)`` over the period, ``--runs``
times (best and median), with its phases timed by wrapping ``backtest.workers.judged_apart`` (the
rules judged by worker processes, one per core: every rule evaluated at every minute; the history
they share loaded first, by ``workers.history``, counted as the load) or ``backtest.judge.judge``
when judged in one process, ``backtest.act.act`` (what was decided stored and acted on, in a scratch
store) and the history's load (``backtest.workers.history``, whichever way the rules are judged);
the rest is the result's assembly.
The baseline: the daemon's own rounds the naive way, over a slice of the period (``--naive-hours``,
the hours around the collapse): one ``daemon.round.Rounds.evaluate_round()`` per minute of the
slice on the simulated clock, the source answering from the same history
(``sources.history.HistorySource``), the same rules as replayed, a scratch store, and a dispatcher
step after each round (the daemon's round wakes its dispatcher), extrapolated per minute to the
period; the backtest over the same slice alternates with it, ``--runs`` times each, and every pair
is checked to record the same events and runs.

Run (the full week, on 2 cores: about 75 s to build the history, a minute a replay, two more for
the profile when the target is missed):
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_backtest.py [--runs 3] [--hours 168]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for benchmarks/

from benchmarks import backtest_history as week
from benchmarks.backtest_report import FALLBACK_RULES, MIB, TARGET, WEEK, report, trim_profile
from specguard.backtest import act, judge, plan, run, workers
from specguard.backtest.run import Backtest, backtest
from specguard.config.loading import Loaded, builtin_pack, load
from specguard.daemon.round import Rounds
from specguard.daemon.shared import Shared

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "backtest.md"
METHOD = (__doc__ or "").split("\n\n")[2:4]  # the docstring's "History" and "Measured"

CONFIG = """\
state_dir: state
baseline: baseline.json
rules: [rules.yaml]
report: {schedule: null}
actions:
  fallback:
    type: feature_flag
    file: {path: flag.json, engage: {speculative: false}, restore: {speculative: true}}
    quiet_period: 10m
"""


# --- the history and the config ----------------------------------------------------------------


def build_history(directory: Path, hours: float) -> dict[str, Any]:
    """The history in ``directory`` (built in a process of its own, or found there already)."""
    figures = directory / "history.json"
    if figures.exists():
        found: dict[str, Any] = json.loads(figures.read_text())
        if found.get("hours") == hours:
            found["reused"] = True
            return found
        shutil.rmtree(directory / "state", ignore_errors=True)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(HERE / "backtest_history.py"), str(directory), "--hours", repr(hours)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"building the history failed ({done.returncode}):\n{done.stderr[-4000:]}")
    built: dict[str, Any] = json.loads(done.stdout)
    built.update(hours=hours, wall=time.perf_counter() - began, reused=False)
    figures.write_text(json.dumps(built))
    return built


def write_config(directory: Path, baseline: dict[str, Any]) -> Path:
    pack = yaml.safe_load(builtin_pack("speculative").read_text())
    for rule in pack["rules"]:
        if rule["name"] in FALLBACK_RULES:
            rule["actions"] = ["log", "fallback"]
    (directory / "rules.yaml").write_text(yaml.safe_dump(pack, sort_keys=False, width=120))
    (directory / "baseline.json").write_text(json.dumps(baseline, indent=1))
    config = directory / "specguard.yaml"
    config.write_text(CONFIG)
    return config


# --- the backtest, its phases timed --------------------------------------------------------------


class Phases:
    """``backtest``'s phases timed by wrapping the functions ``backtest.run`` calls through their
    modules; what ``act`` returned is kept (its events are compared with the naive rounds')."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.per_rule: defaultdict[str, float] = defaultdict(float)
        self.acted: act.Acted | None = None
        self.rss_loaded = 0.0  # the peak RSS once the history was loaded (the judging and acting after)
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Phases:
        real_judge, real_act = judge.judge, act.act

        async def timed_judge(p: plan.Plan, *args: Any, **kwargs: Any) -> judge.Judged:
            began = time.perf_counter()
            try:
                return await real_judge(p, *args, **kwargs)
            finally:
                took = time.perf_counter() - began
                self.seconds["judge"] += took
                self.per_rule[p.name] += took

        async def timed_act(*args: Any, **kwargs: Any) -> act.Acted:
            began = time.perf_counter()
            try:
                self.acted = await real_act(*args, **kwargs)
                return self.acted
            finally:
                self.seconds["act"] += time.perf_counter() - began

        real_apart, real_shared = workers.judged_apart, workers.history

        async def timed_apart(plans: Any, *args: Any, **kwargs: Any) -> list[judge.Judged]:
            # The rules judged by worker processes: the phase's wall time, the history's load
            # (in the parent, for the forked workers) taken out of it; no time per rule.
            began = time.perf_counter()
            loaded = self.seconds["load"]
            try:
                return await real_apart(plans, *args, **kwargs)
            finally:
                self.seconds["judge"] += time.perf_counter() - began - (self.seconds["load"] - loaded)

        def timed_shared(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return real_shared(*args, **kwargs)
            finally:
                self.seconds["load"] += time.perf_counter() - began
                self.rss_loaded = peak_rss()

        for module, name, wrapper in (
            (judge, "judge", timed_judge), (act, "act", timed_act), (workers, "judged_apart", timed_apart),
            (workers, "history", timed_shared),
        ):  # fmt: skip
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, wrapper)
        return self

    def __exit__(self, *_: object) -> None:
        for module, name, real in reversed(self._saved):
            setattr(module, name, real)


@dataclasses.dataclass
class Replay:
    seconds: float
    phases: dict[str, float]
    per_rule: dict[str, float]
    result: Backtest | None  # kept for the last run only
    events: list[tuple[Any, ...]]  # every event judged, with the runs the act phase gave it
    stored: int  # the events the act phase stored (those of the evaluations it acted on)
    steps: int  # the act phase's steps: the moments it moved its clock to
    rss_loaded: float


def events_of(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What is compared between the two ways: each event's rule, series, kind and moment, and the
    status of its runs (from a store's history)."""
    return sorted((e["rule"], e["series"], e["kind"], e["at"], _runs(e)) for e in events)


def judged_events(result: Backtest, acted: act.Acted) -> list[tuple[Any, ...]]:
    """The same of a backtest: every event its rules were judged to have, each with the runs of the
    one the act phase stored (it stores only the evaluations with a firing or a resolution: an
    event of any other has no runs, as in the daemon's store)."""
    runs = {(e["rule"], e["series"], e["kind"], e["at"]): _runs(e) for e in acted.events}
    return sorted(
        (e.rule, e.series, e.kind.value, e.at, runs.get((e.rule, e.series, e.kind.value, e.at), ()))
        for r in result.rules
        for e in r.judged.events
    )


def _runs(event: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((r["action"], r["status"]) for r in event["runs"]))


async def replay(loaded: Loaded, start: float, end: float) -> Replay:
    with Phases() as phases:
        began = time.perf_counter()
        result = await backtest(loaded, start, end)
        seconds = time.perf_counter() - began
    assert phases.acted is not None
    acted = phases.acted
    return Replay(
        seconds, dict(phases.seconds), dict(phases.per_rule), result, judged_events(result, acted),
        len(acted.events), acted.steps, phases.rss_loaded,
    )  # fmt: skip


# --- the baseline: the daemon's rounds, one a minute ---------------------------------------------


@dataclasses.dataclass
class Naive:
    minutes: int
    rounds: float  # evaluate_round, summed
    steps: float  # the dispatcher's step after each round, summed
    load: float  # the history source's load
    events: list[tuple[Any, ...]]

    @property
    def per_minute(self) -> float:
        return (self.rounds + self.steps) / self.minutes


async def naive(loaded: Loaded, start: float, end: float, scratch: Path) -> Naive:
    """One ``Rounds.evaluate_round()`` a minute over [start, end), as a daemon evaluating every
    rule once a minute would, on the simulated clock, the source answering from history."""
    plans = plan.plans(loaded, plan.HISTORY)
    now = run.Now(start)
    began = time.perf_counter()
    store = loaded.config.store_file()
    first, wanted = run.span(plans, store, start, end)
    source = run.history_source(store, first, end, wanted, now)
    load_seconds = time.perf_counter() - began
    replayed = act.for_replay(loaded, [judge.Judged(p) for p in plans], scratch)
    # The rules as replayed (every one once a minute): the config's interval is the replay's.
    replayed = dataclasses.replace(
        replayed, config=replayed.config.model_copy(update={"interval": plan.MINUTE})
    )
    clock = act.Clock(start)
    shared = Shared(replayed, clock)
    await shared.source.close()
    shared.source = source
    rounds = Rounds(shared)
    await shared.store.open()
    moments = judge.moments(start, end - 1e-6, plan.MINUTE)
    spent_rounds = spent_steps = 0.0
    try:
        for at in moments:
            clock.now = at
            now.set(at)
            began = time.perf_counter()
            await rounds.evaluate_round()
            middle = time.perf_counter()
            await shared.dispatcher.step()
            spent_rounds += middle - began
            spent_steps += time.perf_counter() - middle
        events = await shared.store.history(limit=100_000_000)
    finally:
        await shared.dispatcher.stop()
        await shared.store.close()
    return Naive(len(moments), spent_rounds, spent_steps, load_seconds, events_of(events))


# --- all of it --------------------------------------------------------------------------------------


def peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB  # KiB on Linux


async def measure(loaded: Loaded, args: argparse.Namespace) -> dict[str, Any]:
    start, end = week.START, week.START + args.hours * 3600
    out: dict[str, Any] = {"rss before": peak_rss(), "load before": os.getloadavg()[0]}
    runs: list[Replay] = []
    for _ in range(args.runs):
        if runs:
            runs[-1].result = None  # only the last run's result is kept: a run's RSS is its own
        runs.append(await replay(loaded, start, end))
    out["rss after"] = peak_rss()
    out["runs"] = runs
    # The slice the naive rounds run over: the hours around the collapse when the period holds them.
    slice_start = week.COLLAPSE[0] - 4 * 3600
    if not (start <= slice_start and slice_start + args.naive_hours * 3600 <= end):
        slice_start = start
    slice_end = min(end, slice_start + args.naive_hours * 3600)
    out["slice"] = (slice_start, slice_end)
    # The baseline and the backtest over the same slice, alternated: the machine's other work
    # weighs on both alike.
    out["slice runs"], out["naive runs"] = [], []
    for _ in range(args.runs):
        out["slice runs"].append(await replay(loaded, slice_start, slice_end))
        with tempfile.TemporaryDirectory(prefix="specguard-naive-") as scratch:
            out["naive runs"].append(await naive(loaded, slice_start, slice_end, Path(scratch)))
    out["rss end"] = peak_rss()
    out["load after"] = os.getloadavg()[0]
    missed = args.hours == WEEK and statistics.median(r.seconds for r in runs) >= TARGET
    if args.profile == "always" or (args.profile == "auto" and missed):
        profiler = cProfile.Profile()
        profiler.enable()
        await backtest(loaded, start, end)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        out["profile"] = trim_profile(text.getvalue())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="backtest runs (best and median; default 3)")
    parser.add_argument(
        "--hours", type=float, default=WEEK, help="the period, from Monday 00:00 UTC (default 168: the week)"
    )
    parser.add_argument(
        "--naive-hours", type=float, default=6.0, help="the slice the daemon's rounds run over (default 6)"
    )
    parser.add_argument(
        "--profile", choices=("auto", "always", "never"), default="auto",
        help="one more run under cProfile, its top 25 by own time: auto (default) when the week misses the target",
    )  # fmt: skip
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="build the history in DIR and keep it; reused when there already",
    )
    parser.add_argument(
        "--write",
        type=Path,
        default=RESULTS,
        help="the results file (default benchmarks/results/backtest.md)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the result only")
    args = parser.parse_args()
    if args.runs < 1 or not 0 < args.hours <= WEEK or args.naive_hours <= 0:
        parser.error("--runs must be at least 1, --hours in (0, 168], --naive-hours positive")
    with tempfile.TemporaryDirectory(prefix="specguard-bench-backtest-") as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        built = build_history(directory, args.hours)
        how = "reused" if built["reused"] else f"built in {built['wall']:.0f} s"
        print(
            f"history: {built['scrapes']:,} scrapes, {built['rows']:,} rows ({how})",
            file=sys.stderr,
            flush=True,
        )
        loaded = load(write_config(directory, built["baseline"]))
        if not loaded.ok:
            raise SystemExit("\n".join(str(p) for p in loaded.problems))
        figures = asyncio.run(measure(loaded, args))
    text = report(built, figures, args, loaded, METHOD)
    print(text)
    if not args.no_write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)


if __name__ == "__main__":
    main()
