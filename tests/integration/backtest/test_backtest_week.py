"""The report's synthetic week, played live through a real daemon (``tests/backtest_week.py``), then
backtested from the history that daemon kept: every firing it recorded must come back at the same
minute (the backtest judges a minute at its end, the daemon judged it 30 s in), with the same
fallback; for deliberately bad thresholds, the missed incidents and false alarms counted against
the week's known incidents must be the ones the test works out from the timeline's own ground
truth, with none of specguard's code; and the same week, as a Prometheus scraping every 15 s would
hold it (``backtest_week.openmetrics``, written into a real Prometheus's TSDB with ``promtool tsdb
create-blocks-from openmetrics``), replayed from Prometheus must read and fire as from history."""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from specguard.backtest.incidents import Incident, recorded
from specguard.backtest.incidents import load as load_incidents
from specguard.backtest.judge import Trace, moments
from specguard.backtest.prometheus_range import MOST_POINTS, RangeSource
from specguard.backtest.result import RuleResult
from specguard.backtest.run import Backtest, backtest
from specguard.config.loading import load
from tests import backtest_week
from tests.prometheus_server import running_prometheus, write_blocks
from tests.week import COLLAPSE, PRESSURE, Minute

MINUTE = 60.0


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[backtest_week.Played]:
    """The week, played once (about a minute here); the tests replay it. The daemon's database on a
    memory file system when there is one: the test is about what was decided, not durability."""
    shm = Path("/dev/shm")
    state = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else None
    try:
        yield backtest_week.play(
            tmp_path_factory.mktemp("week"), backtest_week.RULES + backtest_week.DETECTOR, state=state
        )
    finally:
        if state is not None:
            shutil.rmtree(state, ignore_errors=True)


def replay(played: backtest_week.Played, rules: Path, incidents: Sequence[Incident] = ()) -> Backtest:
    loaded = load(played.config, [str(rules)])
    assert loaded.ok, loaded.problems
    return asyncio.run(backtest(loaded, played.start, played.end, incidents=incidents))


def test_every_firing_recorded_live_is_reproduced_within_the_minute_it_was_judged(
    played: backtest_week.Played,
) -> None:
    live = recorded(played.store, played.start, played.end)
    # The week's incidents fired live: A's collapse (the playbook's rule and the detector), B's KV.
    assert {(r.rule, r.labels["instance"]) for r in live} >= {
        ("acceptance_collapse", "vllm-a:8000"),
        ("collapse_detector", "vllm-a:8000"),
        ("kv_pressure", "vllm-b:8000"),
        ("collapse_detector", "vllm-b:8000"),
    }
    run = replay(played, played.rules)
    replayed = [(r.name, e) for r in run.rules for e in r.episodes]
    assert len(replayed) == len(live), (replayed, live)
    for firing in live:
        same = [
            e for name, e in replayed
            if name == firing.rule and dict(e.labels) == dict(firing.labels)
            and abs(e.fired - firing.fired) <= MINUTE
        ]  # fmt: skip
        assert len(same) == 1, (firing, replayed)
        moved = [same[0].fired - firing.fired]
        if firing.resolved is None:  # B's draft, losing ground all week, is still firing at its end
            assert same[0].resolved is None
        else:
            assert same[0].resolved is not None
            moved.append(same[0].resolved - firing.resolved)
        if firing.rule == "kv_pressure":
            # A gauge: the daemon's 60 s window held two scrapes a minute apart (both ends count),
            # a minute of history one: within the minute, either way.
            assert all(abs(m) <= MINUTE for m in moved), moved
        else:
            # Counters: the daemon judged each minute's increase 30 s in, the backtest at its end.
            assert moved == [pytest.approx(30.0)] * len(moved)
    for rule in run.rules:
        assert all(x["within"] for x in rule.reproduced), rule.reproduced
        assert len(rule.reproduced) == len(rule.recorded) == len(rule.episodes)


def test_the_fallback_is_engaged_and_restored_as_it_was_live(played: backtest_week.Played) -> None:
    run = replay(played, played.rules)
    assert [speculative for _, speculative in played.flag] == [False, True]
    changes = run.flags["fallback"]
    assert [what for _, what in changes] == ["engage", "restore"]
    for (live_at, _), (replayed_at, _) in zip(played.flag, changes, strict=True):
        assert replayed_at - live_at == pytest.approx(30.0)
    # The restore came after the quiet period (10 minutes after the resolution), through the real
    # controller; the log action ran for the firing and the resolution, rehearsed.
    collapse = next(r for r in run.rules if r.name == "acceptance_collapse")
    (episode,) = collapse.episodes
    assert changes[1][0] - episode.resolved == pytest.approx(600.0)
    statuses = {(a["action"], a["mode"], a["event"], a["status"]) for a in collapse.actions}
    assert ("fallback", "run", "firing", "ok") in statuses
    assert ("fallback", "restore", "resolved", "ok") in statuses
    assert ("log", "run", "firing", "ok") in statuses
    assert all("would" in a["detail"] or a["action"] == "fallback" for a in collapse.actions)


# --- a bad threshold: the known incidents' misses and false alarms ----------------------------------

BAD_RULES = """
rules:
  - name: bad_kv
    signal: kv_cache_usage
    window: 60s
    interval: 60s
    condition: "> 0.5"
    for: 5m
    severity: warning
    actions: [log]
  - name: bad_collapse
    signal: acceptance_rate
    window: 60s
    interval: 60s
    consecutive: 3
    condition: "< 0.05"
    no_data: keep
    severity: critical
    actions: [log]
"""


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()


INCIDENTS = f"""
incidents:
  - start: "{_iso(COLLAPSE[0])}"
    end: "{_iso(COLLAPSE[1])}"
    match: {{instance: "vllm-a:8000"}}
    rules: ["*collapse*"]
    note: draft collapsed
  - start: "{_iso(PRESSURE[0])}"
    end: "{_iso(PRESSURE[1])}"
    match: {{instance: "vllm-b:8000"}}
    rules: ["*kv*"]
    note: KV cache full
"""


def _episodes(minutes: Sequence[Minute], breach: Any, needed: int) -> list[tuple[float, float]]:
    """The test's own arithmetic: runs of at least ``needed`` breaching minutes, each as (when it
    fires, when it resolves): it fires at the ``needed``-th breaching minute's judgement."""
    out: list[tuple[float, float]] = []
    run: list[float] = []
    for m in [*minutes, None]:
        if m is not None and breach(m):
            run.append(m.at)
            continue
        if len(run) >= needed:
            out.append((run[needed - 1], run[-1] + MINUTE))
        run = []
    return out


def test_a_bad_threshold_misses_and_false_alarms_are_the_known_ones(
    played: backtest_week.Played, tmp_path: Path
) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text(BAD_RULES)
    (tmp_path / "incidents.yaml").write_text(INCIDENTS)
    incidents = load_incidents(tmp_path / "incidents.yaml")
    run = replay(played, rules, incidents)
    a, b = played.servers
    by_name = {r.name: r for r in run.rules}

    # KV over 0.5 for 5 minutes: every busy day on both servers. Only B's Thursday holds the incident.
    def kv_high(m: Minute) -> bool:
        return m.kv > 0.5

    expected = {s.instance: _episodes(s.truth, kv_high, 6) for s in (a, b)}  # 6 minutes: 0 to 5m
    kv = by_name["bad_kv"]
    assert kv.score is not None
    got = {i: sorted(e.fired for e in kv.episodes if e.labels["instance"] == i) for i in expected}
    for instance, episodes in expected.items():
        # Each episode fires at the end of its sixth breaching minute, as judged at the minute's end.
        assert got[instance] == [fired + MINUTE for fired, _ in episodes]
    caught_b = [e for e in expected["vllm-b:8000"] if e[0] < PRESSURE[1] and e[1] > PRESSURE[0]]
    assert len(caught_b) == 1
    assert (kv.score.incidents, kv.score.caught, len(kv.score.missed)) == (1, 1, 0)
    assert len(kv.score.false_alarms) == len(expected["vllm-a:8000"]) + len(expected["vllm-b:8000"]) - 1
    assert len(kv.score.false_alarms) >= 10  # a busy afternoon a day on each server

    # Acceptance under 0.05: never, not even during the collapse (about 0.067 at k = 5, alpha 0.25).
    def rate_low(m: Minute) -> bool:
        return m.accepted / m.draft_tokens < 0.05

    assert _episodes(a.truth, rate_low, 3) == [] and _episodes(b.truth, rate_low, 3) == []
    collapse = by_name["bad_collapse"]
    assert collapse.score is not None and collapse.episodes == []
    assert (collapse.score.incidents, collapse.score.caught) == (1, 0)
    assert [i.note for i in collapse.score.missed] == ["draft collapsed"]
    assert collapse.score.false_alarms == []


# --- the same week from a real Prometheus ---------------------------------------------------------

A = {"instance": "vllm-a:8000", "model_name": "model-a"}
B = {"instance": "vllm-b:8000", "model_name": "model-b"}
QUIET_PERIOD = 600.0  # the fallback's quiet_period in backtest_week.CONFIG
# The threshold rules: their ratios and averages are exact from Prometheus too. (The detector weighs
# a window by its counts, which Prometheus's rate() extrapolates to the window's edges, by 4/3 here:
# its evidence differs, as it does for a daemon on Prometheus.)
THRESHOLD_RULES = ("acceptance_collapse", "kv_pressure")


async def _both(played: backtest_week.Played, url: str) -> tuple[Backtest, Backtest, int]:
    """The threshold rules over the week from history, then from Prometheus; and how many range
    queries Prometheus was asked."""
    history = await backtest(
        load(played.config, [str(played.rules)]), played.start, played.end, THRESHOLD_RULES
    )
    source = RangeSource(url, 30.0)
    try:
        from_prometheus = await backtest(
            load(played.config, [str(played.rules)]),
            played.start,
            played.end,
            THRESHOLD_RULES,
            prometheus=source,
        )
    finally:
        await source.close()
    return history, from_prometheus, source.queries


def _times(result: RuleResult) -> list[tuple[dict[str, str], float | None, float, float | None]]:
    return [(dict(e.labels), e.pending, e.fired, e.resolved) for e in result.episodes]


def _readings(trace: Trace) -> dict[float, float]:
    """What the series read at each evaluation that had a value."""
    return {at: value for at, value in zip(trace.at, trace.value, strict=True) if not math.isnan(value)}


@pytest.mark.real
def test_the_week_replayed_from_a_real_prometheus_fires_as_replayed_from_history(
    played: backtest_week.Played, tmp_path: Path, unused_tcp_port: int
) -> None:
    data = write_blocks(backtest_week.openmetrics(played.servers, played.start, played.end), tmp_path)

    async def replayed() -> tuple[Backtest, Backtest, int]:
        async with running_prometheus({}, tmp_path, unused_tcp_port, tsdb=data) as server:
            return await _both(played, server.url)

    history, prometheus, queries = asyncio.run(replayed())
    assert (history.source, prometheus.source) == ("history", "prometheus")
    assert [r.name for r in prometheus.rules] == [r.name for r in history.rules] == list(THRESHOLD_RULES)
    evaluations = len(moments(played.start, played.end - 1e-6, MINUTE))  # 10,080: every minute of the week
    for h, p in zip(history.rules, prometheus.rules, strict=True):
        assert p.plan.skip is None and p.plan.every == MINUTE
        assert p.judged.errors == {} and h.judged.errors == {}
        assert p.judged.evaluations == h.judged.evaluations == evaluations
        # The same readings: every value history had, Prometheus had at the same moment. Prometheus
        # also has the period's first minute, which history cannot: the daemon's first scrape had
        # nothing before it.
        assert p.judged.traces.keys() == h.judged.traces.keys()
        for key, trace in h.judged.traces.items():
            in_history, in_prometheus = _readings(trace), _readings(p.judged.traces[key])
            assert len(in_history) >= evaluations - 2, (h.name, key)
            assert in_history.keys() <= in_prometheus.keys()
            assert in_prometheus.keys() - in_history.keys() <= {played.start + MINUTE}
            different = {
                at: (in_history[at], in_prometheus[at])
                for at in in_history
                if not math.isclose(in_history[at], in_prometheus[at], rel_tol=1e-9, abs_tol=1e-12)
            }
            assert different == {}, (h.name, key, sorted(different.items())[:5])
        assert p.episodes == h.episodes, h.name  # the same firings, and their first actions

    collapse, pressure = prometheus.rules
    assert _times(collapse) == [
        # the first collapsed minute (14:00) judged at 14:01; the third in a row fires at 14:03
        (A, COLLAPSE[0] + MINUTE, COLLAPSE[0] + 3 * MINUTE, COLLAPSE[1] + MINUTE)
    ]
    assert _times(pressure) == [
        # full from 13:00, judged at 13:01; for 5m: fires at 13:06
        (B, PRESSURE[0] + MINUTE, PRESSURE[0] + MINUTE + 5 * MINUTE, PRESSURE[1] + MINUTE)
    ]
    # The fallback engaged and restored at the same moments: at the firing, and a quiet period after
    # the resolution.
    fired, resolved = collapse.episodes[0].fired, collapse.episodes[0].resolved
    assert resolved is not None
    assert (
        prometheus.flags
        == history.flags
        == {"fallback": [(fired, "engage"), (resolved + QUIET_PERIOD, "restore")]}
    )
    # One range query per rule over the whole week, not one query per minute.
    assert queries == len(THRESHOLD_RULES) * math.ceil(evaluations / MOST_POINTS) == 2
