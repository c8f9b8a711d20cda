"""The first phase on several cores gives exactly what it gives in one process: the same moments,
events and traces, whether the workers are forked (the parent's history shared) or spawned (each
loading it), and a worker that fails says why."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from specguard.backtest import workers
from specguard.backtest.run import Backtest, backtest
from specguard.config.loading import load
from tests.backtest_week import record_history
from tests.week import Conditions, Server

T0 = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
HOURS = 6

RULES = """
rules:
  - {name: low, signal: acceptance_rate, window: 2m, interval: 60s, condition: "< 0.5", for: 3m, actions: [log]}
  - {name: kv, signal: kv_cache_usage, window: 60s, interval: 60s, condition: "> 0.9", actions: [log]}
  - name: detector
    signal: token_acceptance
    interval: 60s
    detect: {drop: [0.12, 0.3], warmup: 1h}
    actions: [log]
"""


def dipping(t: float) -> Conditions:
    dip = T0 + 3 * 3600 <= t < T0 + 3.5 * 3600
    return Conditions(alpha=0.3 if dip else 0.8, load=1.0, kv=0.95 if dip else 0.5)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("host")
    (directory / "state").mkdir()
    servers = [Server("a:8000", "m", 5, dipping), Server("b:8000", "m", 3, lambda t: dipping(t - 3600))]
    record_history(directory / "state" / "specguard.db", servers, T0, HOURS * 60)
    (directory / "specguard.yaml").write_text("state_dir: state\n")
    (directory / "rules.yaml").write_text(RULES)
    return directory


def run(host: Path, jobs: int) -> Backtest:
    loaded = load(host / "specguard.yaml", [str(host / "rules.yaml")])
    assert loaded.ok, loaded.problems
    return asyncio.run(backtest(loaded, T0, T0 + HOURS * 3600, jobs=jobs))


def seen(run: Backtest) -> list[object]:
    out: list[object] = []
    for r in run.rules:
        traces = {
            k: (t.at.tobytes(), t.value.tobytes(), bytes(t.state)) for k, t in sorted(r.judged.traces.items())
        }  # NaN as its bytes
        events = [(e.series, e.kind, e.at, e.value) for e in r.judged.events]
        out.append((r.name, r.judged.evaluations, events, traces, [m.at for m in r.judged.moments]))
        out.append([(e.fired, e.resolved) for e in r.episodes])
    return out


def test_workers_judge_exactly_as_one_process_does(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "WORTH_A_WORKER", 0)
    alone = run(host, jobs=1)
    assert sum(len(r.episodes) for r in alone.rules) >= 4  # both servers' dips, by at least two rules
    forked = run(host, jobs=2)
    assert seen(forked) == seen(alone)
    # A parent with other threads spawns its workers, which load the history themselves.
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    spawned = run(host, jobs=2)
    assert seen(spawned) == seen(alone)


def test_a_short_period_is_judged_in_the_parent(host: Path) -> None:
    loaded = load(host / "specguard.yaml", [str(host / "rules.yaml")])
    from specguard.backtest.plan import plans

    six_hours = plans(loaded, "history")
    assert workers.jobs_for(six_hours, T0, T0 + HOURS * 3600) == 1  # 1,080 evaluations
    assert workers.jobs_for(six_hours, T0, T0 + 7 * 86400, asked=2) == 2
    assert workers.jobs_for(six_hours[:1], T0, T0 + 7 * 86400, asked=2) == 1  # one rule: nothing to share


def test_a_coroutine_that_waits_is_refused_rather_than_left_half_run() -> None:
    async def waits() -> int:
        await asyncio.sleep(0)
        return 1

    async def does_not() -> int:
        return 2

    assert workers.settled(does_not()) == 2
    with pytest.raises(RuntimeError, match="needs an event loop"):
        workers.settled(waits())


def test_a_backtest_leaves_no_thread_behind_so_the_next_one_forks(host: Path) -> None:
    """``--compare`` runs two backtests in one event loop: the first's acting (its store, the
    loop's pool of threads) must leave the process single-threaded, or the second would spawn its
    workers and load the history again in each."""
    loaded = load(host / "specguard.yaml", [str(host / "rules.yaml")])

    async def first_then_count() -> int:
        await backtest(loaded, T0, T0 + HOURS * 3600, jobs=1)
        await asyncio.to_thread(lambda: None)  # the loop's pool still works afterwards
        return threading.active_count()

    before = threading.active_count()
    assert asyncio.run(first_then_count()) == before + 1  # the pool's one thread, started just now
    assert threading.active_count() == before
