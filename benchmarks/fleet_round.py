"""The daemon's evaluation rounds over a Prometheus source, in a process of their own so that its
memory is the daemon's: run by bench_fleet_prometheus.py, it prints one JSON object.

The daemon's parts are built as ``specguard run`` builds them (``Daemon`` from the loaded config:
the store opened, the dispatcher, the Prometheus source), and each round is the daemon's own
(``daemon.round.Rounds``: every enabled rule read, judged by the engine, its states committed to the
store and its events handed to the dispatcher, whose ``log`` actions run beside the next round). Two
things differ from ``specguard run``, both measuring aids: the source is the daemon's
``PrometheusSource`` given a clock (its ``clock`` argument), so that round i asks Prometheus about the
moment ``end - (rounds - 1 - i) * every`` of the backfilled data instead of the wall clock; and it
and the rounds count what they do (each query's time, Prometheus's share of it, the answer's size;
each rule's time). Rounds run back to back.

After the measured rounds: the last round's queries asked one after another and all at once; with
``--profile``, three more rounds under cProfile; with ``--warm N``, a daemon near the end of its
collapse detector's warm-up (benchmarks/fleet_warmup.py: every series N / 2 windows from it) and
rounds a detector's window apart: N / 2 - 1 before the warm-ups are complete, those in which they
are checked (at most ``CHECKS_PER_EVALUATION`` a round), and N / 2 after.

    python benchmarks/fleet_round.py CONFIG --end UNIX_SECONDS --log FILE --prometheus-pid PID
        [--rounds 20] [--every 15] [--profile] [--warm N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import fleet_probes as probes
from benchmarks import fleet_warmup
from benchmarks.fleet_promserver import cpu_seconds
from specguard.common import logs
from specguard.config.loading import LoadedRule, load
from specguard.daemon.alertmanager.book import Receipt
from specguard.daemon.round import Rounds
from specguard.daemon.runtime import Daemon
from specguard.engine.detection import CHECKS_PER_EVALUATION, warmup_windows
from specguard.engine.warmup import Held
from specguard.sources.base import SourceResult
from specguard.sources.prometheus import PrometheusSource
from specguard.store.commits import stored_form
from specguard.store.records import SCHEDULE, SeriesState, State

WARM_ROUNDS = 1000  # the number of the warm-up phase's first round
RULE: ContextVar[str] = ContextVar("rule", default="")  # the rule a query is asked for


@dataclass
class Query:
    round: int
    rule: str
    expr: str
    seconds: float  # the source's whole query: request, answer, JSON, parse
    server: float  # until the answer's headers: Prometheus's evaluation and encoding
    size: int  # bytes of the answer's body
    series: int  # series in the answer (-1: the query failed)


class CountedSource(PrometheusSource):
    """The daemon's Prometheus source, each query timed and measured."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queries: list[Query] = []
        self.round = 0
        self._answers: dict[str, tuple[float, int]] = {}
        self._client._session.hooks["response"].append(self._answered)

    def _answered(self, response: Any, *args: Any, **kwargs: Any) -> None:
        expr = parse_qs(urlsplit(response.request.url).query).get("query", [""])[0]
        self._answers[expr] = (response.elapsed.total_seconds(), len(response.content))

    async def _query(
        self, expr: str, at: float | None = None
    ) -> SourceResult | list[tuple[Mapping[str, str], float]]:
        started = time.perf_counter()
        answer = await super()._query(expr, at)
        took = time.perf_counter() - started
        server, size = self._answers.pop(expr, (0.0, 0))
        series = len(answer) if isinstance(answer, list) else -1
        self.queries.append(Query(self.round, RULE.get(), expr, took, server, size, series))
        return answer


class TimedRounds(Rounds):
    """The daemon's rounds, each rule's evaluation timed (reading, engine, store, dispatch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.took: dict[str, list[float]] = {}

    def _ask_ahead(self, rules: Sequence[LoadedRule]) -> dict[str, asyncio.Task[SourceResult]]:
        """As the daemon's, each reading's task started with its rule's name in RULE (a task keeps
        the context it was made in), so that its queries are counted for the rule."""
        ahead: dict[str, asyncio.Task[SourceResult]] = {}
        for item in rules:
            token = RULE.set(item.name)
            try:
                ahead.update(super()._ask_ahead([item]))
            finally:
                RULE.reset(token)
        return ahead

    async def evaluate_one(
        self,
        item: LoadedRule,
        trigger: str = SCHEDULE,
        touched: Sequence[Receipt] | None = None,
        ahead: Awaitable[SourceResult] | None = None,
        asked: float = 0.0,
    ) -> None:
        """Its time: waiting for its reading (asked for at the round's start), the engine, the store,
        the dispatch."""
        token = RULE.set(item.name)
        started = time.perf_counter()
        try:
            await super().evaluate_one(item, trigger, touched, ahead, asked)
        finally:
            RULE.reset(token)
        self.took.setdefault(item.name, []).append(time.perf_counter() - started)


def memory() -> dict[str, float]:
    """This process's VmRSS and VmHWM (its peak), in MiB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _states(held: Mapping[str, Mapping[str, SeriesState]]) -> tuple[dict[str, dict[str, int]], int]:
    """Each rule's series by state, and how many instances they belong to."""
    states: dict[str, dict[str, int]] = {}
    instances: set[str] = set()
    for name, series in held.items():
        counts = {state.value: 0 for state in State}
        for each in series.values():
            counts[each.state.value] += 1
            instances.add(each.labels.get("instance", ""))
        states[name] = counts
    return states, len(instances - {""})


async def build(config: Path, end: float) -> tuple[Daemon, CountedSource, list[float]]:
    """The daemon's parts as ``specguard run`` builds them, its source given a clock (the list's
    one value, set by the caller), the store opened and its states read."""
    loaded = load(config)
    if loaded.errors:
        raise SystemExit("\n".join(str(p) for p in loaded.errors))
    prometheus = loaded.config.sources.prometheus
    assert prometheus is not None
    daemon = Daemon(loaded, config)
    await daemon.source.close()
    moment = [end]
    source = CountedSource(
        prometheus.url, prometheus.timeout, bearer_token=loaded.prometheus_token,
        verify_tls=prometheus.verify_tls, clock=lambda: moment[0],
    )  # fmt: skip
    daemon.source = source
    await daemon.store.open()
    await daemon.forget_unconfigured()
    daemon.states = await daemon.store.load_states()
    return daemon, source, moment


async def run_rounds(
    timed: TimedRounds,
    source: CountedSource,
    moment: list[float],
    end: float,
    every: float,
    count: int,
    first: int,
    after: Callable[[], None] = lambda: None,
) -> list[float]:
    """``count`` rounds, back to back, the last at ``end``; numbered from ``first``; ``after`` runs
    after each (outside its time)."""
    took = []
    for i in range(count):
        moment[0] = end - (count - 1 - i) * every
        source.round = first + i
        started = time.perf_counter()
        await timed.evaluate_round()
        took.append(time.perf_counter() - started)
        after()
    return took


async def warm_phase(
    daemon: Daemon, timed: TimedRounds, source: CountedSource, moment: list[float], end: float,
    short: int, after: int, prometheus: int,
) -> dict[str, Any]:  # fmt: skip
    """A daemon near the end of its detectors' warm-up: every series ``short`` windows from it,
    then rounds a detector's window apart (numbered from WARM_ROUNDS): ``short - 1`` before any
    warm-up is complete, those in which the warm-ups are checked (``CHECKS_PER_EVALUATION`` a round),
    and ``after`` more; ``prometheus``: its process id."""
    item = next(r for r in daemon.loaded.enabled_rules() if r.rule.detect is not None)
    detect = item.rule.detect
    assert detect is not None
    window = timed.interval_of(item)
    seeded, filled = fleet_warmup.near_the_end(daemon.states[item.name], detect, window, short)
    daemon.states[item.name] = seeded
    gc.collect()
    # What the store writes for the rule at each of its evaluations: each state's JSON and its
    # warm-up's windows, packed, in their own column.
    written = [stored_form(s.detector) for s in seeded.values() if s.detector is not None]
    checks = max(1, math.ceil(filled / CHECKS_PER_EVALUATION))
    phases = {"before": [0, short - 1], "checking": [short - 1, short - 1 + checks]}
    phases["after"] = [phases["checking"][1], phases["checking"][1] + after]
    holding: list[int] = []  # after each round, the series whose warm-up still holds its windows

    def count_holding() -> None:
        holding.append(
            sum(
                1
                for s in daemon.states[item.name].values()
                if s.detector and Held.from_json(s.detector.get("held"))
            )
        )

    before = memory()
    marks = {name: len(seconds) for name, seconds in timed.took.items()}
    cpu, prometheus_cpu = _cpu(), cpu_seconds(prometheus)
    count = phases["after"][1]
    took = await run_rounds(timed, source, moment, end, window, count, WARM_ROUNDS, count_holding)
    cpu_after, prometheus_after = _cpu(), cpu_seconds(prometheus)
    await daemon.dispatcher.run()
    return {
        "rule": item.name,
        "filled": filled,
        "windows": warmup_windows(detect, window) - short,
        "window": window,
        "checks_per_evaluation": CHECKS_PER_EVALUATION,
        "phases": phases,
        "holding": holding,
        "stored_json": sum(len(text) for text, _ in written if text is not None),
        "stored_windows": sum(len(packed) for _, packed in written if packed is not None),
        "rss_before": before["VmRSS"],
        "rounds": took,
        "rules": {name: seconds[marks.get(name, 0) :] for name, seconds in timed.took.items()},
        "cpu": cpu_after - cpu,
        "prometheus_cpu": prometheus_after - prometheus_cpu,
        "rss_end": memory()["VmRSS"],
        "peak": memory()["VmHWM"],
        "states": _states(daemon.states)[0],
    }


async def measure(
    config: Path, end: float, rounds: int, every: float, log_file: Path, profile: bool, warm: int,
    prometheus: int,
) -> dict[str, Any]:  # fmt: skip
    with log_file.open("a") as log_stream:
        logs.setup("json", "info", stream=log_stream)
        daemon, source, moment = await build(config, end)
        timed = TimedRounds(daemon)
        gc.collect()
        before = memory()
        cpu, prometheus_cpu = _cpu(), cpu_seconds(prometheus)
        took = await run_rounds(timed, source, moment, end, every, 1, 0)
        after_first = memory()
        took += await run_rounds(timed, source, moment, end, every, rounds - 1, 1)
        moment[0] = end
        cpu_after, prometheus_after = _cpu(), cpu_seconds(prometheus)
        await daemon.dispatcher.run()  # the log actions' runs still under way
        held = memory()
        states, instances = _states(daemon.states)
        rules = {name: list(seconds) for name, seconds in timed.took.items()}
        queries = [asdict(q) for q in source.queries]
        # After the measured rounds: the last round's queries one by one and all at once, a
        # profile of more rounds at the last moment, then the warm-up's end.
        last = [q.expr for q in source.queries if q.round == rounds - 1]
        source.round = rounds
        together = await probes.one_by_one_or_together(source, last, end)
        profiled = await probes.profile(timed.evaluate_round, 3) if profile else []
        warmed = (
            await warm_phase(daemon, timed, source, moment, end, warm // 2, warm - warm // 2, prometheus)
            if warm
            else None
        )
        await daemon.dispatcher.stop()
        await source.close()
        await daemon.store.close()
    return {
        "rounds": took,
        "rules": rules,
        "queries": queries,
        "cpu": cpu_after - cpu,  # over the rounds
        "prometheus_cpu": prometheus_after - prometheus_cpu,
        "intervals": {item.name: timed.interval_of(item) for item in daemon.loaded.enabled_rules()},
        "rss_before": before["VmRSS"],
        "rss_after_first": after_first["VmRSS"],
        "rss_end": held["VmRSS"],
        "peak": held["VmHWM"],
        "states": states,
        "instances": instances,
        "errors": {name: error for name, error in daemon.rule_errors.items() if error},
        "together": together,
        "profile": profiled,
        "warm": warmed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("--end", type=float, required=True, help="the data's last moment (Unix seconds)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--every", type=float, default=15.0, help="data seconds between rounds")
    parser.add_argument("--log", type=Path, required=True, help="the daemon's log (JSON lines)")
    parser.add_argument("--profile", action="store_true", help="profile 3 more rounds at the end")
    parser.add_argument(
        "--prometheus-pid", type=int, required=True, help="its CPU over the rounds is measured"
    )
    parser.add_argument(
        "--warm", type=int, default=0, help="then this many rounds of a daemon near the end of its warm-up"
    )
    args = parser.parse_args()
    result = asyncio.run(
        measure(
            args.config,
            args.end,
            args.rounds,
            args.every,
            args.log,
            args.profile,
            args.warm,
            args.prometheus_pid,
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
