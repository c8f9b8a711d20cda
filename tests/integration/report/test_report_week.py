"""A week (and the week before it) played minute by minute through the real scrape source, history,
engine, dispatcher, feature flag and store, on a simulated clock; then the report's JSON is checked
number by number against figures the test computes from the timeline's own ground truth.

Scenarios: on Tuesday 14:00-15:30 server A's draft collapses (per-token acceptance 0.25), the
playbook-style rule fires after three low evaluations and the fallback flag is engaged, then
restored ten minutes after the rule resolves; on Thursday 13:00-17:00 server B runs with its KV
cache full (0.97), preempting and slower; B's draft degrades through the week.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.store import history
from tests import week
from tests.week import BEFORE, COLLAPSE, DAY, MONDAY, Server, Timeline, server_a, server_b

QUIET = 600.0
C_A, C_B = 0.1, 0.05  # A's draft cost is given; B's is the default for an EAGLE head

CONFIG = """
state_dir: state
baseline: baseline.json
interval: 60s
sources:
  scrape:
    targets:
      - {url: "http://127.0.0.1:9/a/metrics", name: "vllm-a:8000"}
      - {url: "http://127.0.0.1:9/b/metrics", name: "vllm-b:8000"}
rules: [rules.yaml]
report: {schedule: null}
actions:
  fallback:
    type: feature_flag
    file: {path: flag.json, engage: {speculative: false}, restore: {speculative: true}}
    quiet_period: 10m
"""
RULES = """
rules:
  - name: acceptance_collapse
    signal: acceptance_rate
    window: 60s
    interval: 60s
    consecutive: 3
    condition: "< 0.4"
    no_data: keep
    severity: critical
    actions: [log, fallback]
    messages:
      still_breaching: "acceptance {value:.3f} below {threshold} for {consecutive} evaluations on {labels[instance]}"
      recovered: "acceptance {value:.3f} back at or above {threshold} on {labels[instance]}"
  - name: kv_pressure
    signal: kv_cache_usage
    window: 60s
    interval: 60s
    condition: "> 0.95"
    for: 5m
    severity: warning
    actions: [log]
"""
BASELINE = {
    "version": 2,
    "measured_at": "2026-11-20T10:00:00Z",
    "method": "specguard bench",
    "entries": [
        {"model": "model-a", "signals": {"e2e_latency_p95": 3.0, "ttft_p95": 0.15, "itl_p50": 0.03},
         "speculative": {"draft_cost": C_A}},
        {"model": "model-b", "signals": {"e2e_latency_p95": 3.0, "itl_p95": 0.1},
         "speculative": {"method": "eagle3"}},
    ],
}  # fmt: skip


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both weeks played once (about a minute on a small machine); the tests read the result."""
    import asyncio

    tmp = tmp_path_factory.mktemp("week")
    # The store on a memory file system when there is one: 10,080 rounds' synced commits cost
    # seconds of fsync on a disk, and the test is about arithmetic, not durability.
    shm = Path("/dev/shm")
    state = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp / "state"
    (tmp / "specguard.yaml").write_text(CONFIG.replace("state_dir: state", f"state_dir: {state}"))
    (tmp / "rules.yaml").write_text(RULES)
    (tmp / "baseline.json").write_text(json.dumps(BASELINE))
    mp = pytest.MonkeyPatch()
    clock = Clock(BEFORE)
    mp.setattr(time, "time", clock)  # every time.time() of the daemon's code reads the simulated clock
    try:
        return asyncio.run(_play(tmp, clock))
    finally:
        mp.undo()
        shutil.rmtree(state, ignore_errors=True)


async def _play(tmp: Path, clock: Clock) -> dict[str, Any]:
    from specguard.report import weekly

    loaded = load(tmp / "specguard.yaml")
    assert loaded.ok, loaded.problems
    daemon = Daemon(loaded, tmp / "specguard.yaml")
    await daemon.store.open()
    a = Server("vllm-a:8000", "model-a", 5, server_a)
    b = Server("vllm-b:8000", "model-b", 3, server_b)
    urls = {a.instance: "http://127.0.0.1:9/a/metrics", b.instance: "http://127.0.0.1:9/b/metrics"}
    timeline = Timeline([a, b])
    flag_changes: list[tuple[float, bool]] = []
    scrapes: list[float] = []
    minute = BEFORE
    while minute < MONDAY + 7 * DAY:
        clock.now = minute + 30  # the scrape in the middle of the minute
        for server in (a, b):
            timeline.advance(server, minute)
            daemon.source.ingest(urls[server.instance], timeline.exposition(server), clock.now)
        scrapes.append(clock.now)
        await daemon.jobs.record_history(daemon.source)
        if minute >= MONDAY:
            await daemon.evaluate_round()
            await daemon.dispatcher.run()  # restores whose quiet period is over
            await daemon.dispatcher.settled()  # the flag's controller, at work aside: done at this minute
            flag = tmp / "flag.json"
            if flag.exists():
                speculative = json.loads(flag.read_text())["speculative"]
                if not flag_changes or flag_changes[-1][1] != speculative:
                    flag_changes.append((clock.now, speculative))
        minute += 60
    clock.now = MONDAY + 7 * DAY + 3600
    remedies = [name for name, action in loaded.actions.items() if action.changes_world]
    report, paths = await weekly.make(
        daemon.store, MONDAY, MONDAY + 7 * DAY, ["json"], tmp / "out", loaded.baseline, remedies=remedies
    )
    size = await daemon.store.call(history.size)
    await daemon.store.close()
    return {
        "report": report,
        "paths": paths,
        "a": a,
        "b": b,
        "flag": flag_changes,
        "scrapes": scrapes,
        "size": size,
    }


def _in(minutes: list[week.Minute], start: float, end: float) -> list[week.Minute]:
    return [m for m in minutes if start <= m.at < end]


def _expected(minutes: list[week.Minute], k: int, cost: float) -> dict[str, Any]:
    """The headline figures of a window, from the ground truth alone."""
    drafts = sum(m.drafts for m in minutes)
    accepted = sum(m.accepted for m in minutes)
    seconds = 60.0 * len(minutes)
    mal = 1 + accepted / drafts
    out: dict[str, Any] = {
        "acceptance_rate": accepted / sum(m.draft_tokens for m in minutes),
        "mean_acceptance_length": mal,
        "estimated_speedup": mal / (1 + k * cost),
        "generation_throughput": sum(m.generation_tokens for m in minutes) / seconds,
        "request_rate": sum(m.requests for m in minutes) / seconds,
        "kv_cache_usage_mean": sum(m.kv for m in minutes) / len(minutes),
        "kv_cache_usage_max": max(m.kv for m in minutes),
        "preemptions": float(sum(m.preemptions for m in minutes)),
        "drafts": float(drafts),
    }
    for name, part, q in (
        ("ttft_p50", "ttft", 0.5), ("ttft_p95", "ttft", 0.95), ("itl_p50", "itl", 0.5),
        ("itl_p95", "itl", 0.95), ("e2e_latency_p50", "e2e", 0.5), ("e2e_latency_p95", "e2e", 0.95),
    ):  # fmt: skip
        out[name] = week.quantile(q, week.histogram(minutes, part))
    return out


def _series(report: dict[str, Any], instance: str) -> dict[str, Any]:
    (found,) = [s for s in report["series"] if s["instance"] == instance]
    return found


def _counted(server: Server, start: float, end: float) -> list[week.Minute]:
    """The minutes history can know: every one but the very first (no scrape before it to count
    from), though its gauges were read."""
    return _in(server.truth[1:], start, end)


@pytest.mark.parametrize(("name", "cost"), [("a", C_A), ("b", C_B)])
def test_every_headline_figure_equals_the_ground_truth(
    played: dict[str, Any], name: str, cost: float
) -> None:
    server: Server = played[name]
    series = _series(played["report"], server.instance)
    now = _expected(_in(server.truth, MONDAY, MONDAY + 7 * DAY), server.k, cost)
    before = _expected(_counted(server, BEFORE, MONDAY), server.k, cost)
    # The first minute's gauges count (its scrape was read) though its counters do not.
    first = server.truth[0]
    before_gauges = [m.kv for m in _in(server.truth, BEFORE, MONDAY)]
    before["kv_cache_usage_mean"] = sum(before_gauges) / len(before_gauges)
    before["kv_cache_usage_max"] = max(before_gauges)
    minutes_before = len(_in(server.truth, BEFORE, MONDAY))
    for rate in ("generation_throughput", "request_rate"):
        before[rate] *= (minutes_before - 1) / minutes_before
    assert first.at == BEFORE
    assert series["k"] == server.k
    assert series["draft_cost"] == cost
    for figure, value in now.items():
        got = series["headline"][figure]
        assert got["value"] == pytest.approx(value, rel=1e-9), figure
        assert got["previous"] == pytest.approx(before[figure], rel=1e-9), figure
        if before[figure]:
            assert got["change"] == pytest.approx((value - before[figure]) / abs(before[figure]), rel=1e-9)
        else:  # no change can be told from nothing (no preemptions the week before)
            assert got["change"] is None, figure


def _acceptance(minutes: list[week.Minute], k: int, cost: float) -> dict[str, Any]:
    """The acceptance figures of a day or an hour, from the ground truth alone."""
    drafts = sum(m.drafts for m in minutes)
    accepted = sum(m.accepted for m in minutes)
    mal = 1 + accepted / drafts
    return {
        "acceptance_rate": accepted / sum(m.draft_tokens for m in minutes),
        "mean_acceptance_length": mal,
        "estimated_speedup": mal / (1 + k * cost),
        "drafts": drafts,
    }


@pytest.mark.parametrize(("name", "cost"), [("a", C_A), ("b", C_B)])
def test_per_position_by_day_by_hour_and_hour_by_hour_equal_the_ground_truth(
    played: dict[str, Any], name: str, cost: float
) -> None:
    server: Server = played[name]
    series = _series(played["report"], server.instance)
    minutes = _in(server.truth, MONDAY, MONDAY + 7 * DAY)
    drafts = sum(m.drafts for m in minutes)
    assert series["per_position"] == pytest.approx(
        [sum(m.positions[i] for m in minutes) / drafts for i in range(server.k)], rel=1e-12
    )
    expected_days = [
        {"day": datetime.fromtimestamp(MONDAY + d * DAY, UTC).strftime("%Y-%m-%d"),
         **_acceptance(_in(minutes, MONDAY + d * DAY, MONDAY + (d + 1) * DAY), server.k, cost)}
        for d in range(7)
    ]  # fmt: skip
    expected_hours = [
        {"hour": h, **_acceptance([m for m in minutes if week.hour_of(m.at) == h], server.k, cost)}
        for h in range(24)
    ]
    expected_hourly = [
        {"at": _iso(MONDAY + h * 3600),
         **_acceptance(_in(minutes, MONDAY + h * 3600, MONDAY + (h + 1) * 3600), server.k, cost)}
        for h in range(7 * 24)
    ]  # fmt: skip
    for got, expected in (
        (series["by_day"], expected_days),
        (series["by_hour_of_day"], expected_hours),
        (series["hourly"], expected_hourly),
    ):
        assert len(got) == len(expected)
        for entry, want in zip(got, expected, strict=True):
            assert entry == {key: pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
                             for key, value in want.items()}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "cost", "baselines"),
    [
        ("a", C_A, {"e2e_latency_p95": 3.0, "ttft_p95": 0.15, "itl_p50": 0.03}),
        ("b", C_B, {"e2e_latency_p95": 3.0, "itl_p95": 0.1}),
    ],
)
def test_latency_is_set_against_the_baseline(
    played: dict[str, Any], name: str, cost: float, baselines: dict[str, float]
) -> None:
    server: Server = played[name]
    series = _series(played["report"], server.instance)
    latency = {row["signal"]: row for row in series["latency"]}
    expected = _expected(_in(server.truth, MONDAY, MONDAY + 7 * DAY), server.k, cost)
    assert set(latency) == {
        "ttft_p50",
        "ttft_p95",
        "itl_p50",
        "itl_p95",
        "e2e_latency_p50",
        "e2e_latency_p95",
    }
    assert latency["ttft_p50"]["baseline"] is None and latency["ttft_p50"]["ratio"] is None
    for signal, row in latency.items():
        assert row["value"] == pytest.approx(expected[signal], rel=1e-9)
        assert row["baseline"] == baselines.get(signal)
        if signal in baselines:
            assert row["ratio"] == pytest.approx(expected[signal] / baselines[signal], rel=1e-9)


def _low_runs(server: Server, threshold: float, below: bool, value: Any) -> list[tuple[float, float]]:
    """(breach start, first good) of each run of breaching evaluations, from the truth alone."""
    runs, start = [], None
    for m in _in(server.truth, MONDAY, MONDAY + 7 * DAY):
        v = value(m)
        breach = v < threshold if below else v > threshold
        if breach and start is None:
            start = m.at + 30
        elif not breach and start is not None:
            runs.append((start, m.at + 30))
            start = None
    return runs


def test_the_collapse_fired_once_acted_in_two_evaluations_and_the_fallback_time_is_exact(
    played: dict[str, Any],
) -> None:
    report = played["report"]
    runs = _low_runs(played["a"], 0.4, True, lambda m: m.accepted / m.draft_tokens)
    assert len(runs) == 1
    began, good = runs[0]
    fired = began + 2 * 60  # three evaluations in a row: the third fires
    (rule,) = [r for r in report["rules"] if r["rule"] == "acceptance_collapse"]
    assert rule["fired"] == 1 and rule["resolved"] == 1
    (firing,) = rule["firings"]
    assert firing["at"] == _iso(fired) and firing["since"] == _iso(began)
    assert firing["resolved_at"] == _iso(good)
    assert firing["time_to_act"] == pytest.approx(fired - began)
    assert rule["median_time_to_act"] == pytest.approx(fired - began)
    assert firing["acted_by"] == "fallback"
    # the value it fired on: the acceptance of the 60 s window up to the firing's scrape
    (at_firing,) = [m for m in played["a"].truth if m.at + 30 == fired]
    assert firing["value"] == pytest.approx(at_firing.accepted / at_firing.draft_tokens, rel=1e-9)
    # what the firing and its resolution said, each in the rule's words for it
    assert firing["message"] == f"acceptance {firing['value']:.3f} below 0.4 for 3 evaluations on vllm-a:8000"
    back = re.fullmatch(
        r"acceptance ([\d.]+) back at or above 0\.4 on vllm-a:8000", firing["resolved_message"]
    )
    assert back and float(back.group(1)) >= 0.4, firing["resolved_message"]
    # The flag file, as the test saw it change, against the report's span.
    engaged, restored = played["flag"][0][0], played["flag"][1][0]
    assert played["flag"][0][1] is False and played["flag"][1][1] is True
    assert engaged == fired and restored == good + QUIET
    fallbacks = report["fallbacks"]
    assert fallbacks["count"] == 1
    assert fallbacks["seconds"] == pytest.approx(restored - engaged)
    assert fallbacks["spans"][0]["engaged"] == _iso(engaged)
    assert fallbacks["spans"][0]["restored"] == _iso(restored)
    assert fallbacks["spans"][0]["seconds"] == pytest.approx(restored - engaged)


def test_the_kv_pressure_afternoon_fired_after_five_minutes(played: dict[str, Any]) -> None:
    # The signal is the gauge's average over the 60 s window: this scrape's and the one before.
    minutes = _in(played["b"].truth, MONDAY, MONDAY + 7 * DAY)
    high = [m.at + 30 for before, m in itertools.pairwise(minutes) if (before.kv + m.kv) / 2 > 0.95]
    began, ended = high[0], high[-1]
    assert ended - began == 60 * (len(high) - 1)  # one afternoon, no gap
    (rule,) = [r for r in played["report"]["rules"] if r["rule"] == "kv_pressure"]
    (firing,) = rule["firings"]
    assert firing["since"] == _iso(began)
    assert firing["at"] == _iso(began + 300)  # `for: 5m`
    assert firing["resolved_at"] == _iso(ended + 60)
    assert firing["time_to_act"] == pytest.approx(300.0)
    assert firing["acted_by"] == "log"  # no remedy among its actions: the first that ran
    # a rule without messages of its own: the defaults, each true of its value
    said = re.fullmatch(r"kv_cache_usage ([\d.]+) > 0\.95 on (.*): breaching for 5m", firing["message"])
    assert said and float(said.group(1)) > 0.95, firing["message"]
    back = re.fullmatch(
        r"kv_cache_usage ([\d.]+) <= 0\.95 on (.*): ok again: resolved", firing["resolved_message"]
    )
    assert back and float(back.group(1)) <= 0.95, firing["resolved_message"]
    before, at_firing = [m for m in minutes if m.at + 30 in (began + 240, began + 300)]
    assert firing["value"] == pytest.approx((before.kv + at_firing.kv) / 2, rel=1e-9)
    b = _series(played["report"], "vllm-b:8000")
    assert b["headline"]["kv_cache_usage_max"]["value"] == 0.97
    assert b["headline"]["preemptions"]["value"] == 3 * 240


def _recommended(played: dict[str, Any], kind: str, instance: str) -> dict[str, Any] | None:
    found = [
        r for r in played["report"]["recommendations"] if r["kind"] == kind and r["instance"] == instance
    ]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize(("name", "cost"), [("a", C_A), ("b", C_B)])
def test_the_k_recommendation_is_the_speedup_of_each_k_from_the_ground_truth(
    played: dict[str, Any], name: str, cost: float
) -> None:
    """(1 + sum of p_i over i < k) / (1 + k c) for k = 1..8, past the measured k with the p_i going
    on at the mean conditional rate of the last three positions after the first (as docs/report.md says)."""
    server: Server = played[name]
    minutes = _in(server.truth, MONDAY, MONDAY + 7 * DAY)
    drafts = sum(m.drafts for m in minutes)
    p = [sum(m.positions[i] for m in minutes) / drafts for i in range(server.k)]
    conditional = [p[i] / p[i - 1] for i in range(1, server.k)][-3:]
    tail = min(1.0, sum(conditional) / len(conditional))
    while len(p) < 8:
        p.append(p[-1] * tail)
    table = [(1 + sum(p[:k])) / (1 + k * cost) for k in range(1, 9)]
    best = max(range(1, 9), key=lambda k: (table[k - 1], -k))
    gain = table[best - 1] / table[server.k - 1] - 1
    item = _recommended(played, "num_speculative_tokens", server.instance)
    assert item is not None
    data = item["data"]
    assert [row["k"] for row in data["table"]] == list(range(1, 9))
    assert [row["speedup"] for row in data["table"]] == pytest.approx(table, rel=1e-9)
    assert [row["extrapolated"] for row in data["table"]] == [k > server.k for k in range(1, 9)]
    assert data["best_k"] == best and data["gain"] == pytest.approx(gain, rel=1e-9)
    assert data["current_speedup"] == pytest.approx(table[server.k - 1], rel=1e-9)
    assert data["recommended_k"] == (best if gain >= 0.03 else server.k)
    assert data["draft_cost"] == cost


def test_the_tuesday_collapse_is_named_as_the_hours_speculation_lost(played: dict[str, Any]) -> None:
    """Hours of the week whose speedup from the truth is below 1: the collapse's, which the hour of
    the day's weekly average hides."""
    minutes = _in(played["a"].truth, MONDAY, MONDAY + 7 * DAY)
    lost = []
    for h in range(7 * 24):
        hour = _in(minutes, MONDAY + h * 3600, MONDAY + (h + 1) * 3600)
        if _acceptance(hour, 5, C_A)["estimated_speedup"] < 1 and sum(m.drafts for m in hour) >= 100:
            lost.append(_iso(MONDAY + h * 3600))
    assert lost == [_iso(COLLAPSE[0])]  # 14:00-15:00; 15:00-16:00 is half healthy
    item = _recommended(played, "speculation_lost", "vllm-a:8000")
    assert item is not None
    assert [(span["from"], span["hours"]) for span in item["data"]["spans"]] == [(lost[0], 1)]
    # and the latency figures more than 10 % over their baseline, from the truth
    expected = _expected(minutes, 5, C_A)
    baselines = {"ttft_p95": 0.15, "itl_p50": 0.03, "e2e_latency_p95": 3.0}
    over = [
        name for name in ("ttft_p95", "itl_p50", "e2e_latency_p95") if expected[name] / baselines[name] > 1.1
    ]
    assert [row["signal"] for row in item["data"]["latency"]] == over
    assert item[
        "title"
    ] == "speculation lost: slower than plain decoding on Tue 2026-12-01 14:00-15:00 UTC" + (
        f"; {', '.join(over)} above 1.1x baseline" if over else ""
    )
    assert item["data"]["hours"] == []  # no hour of the day loses on the week's average


def test_the_degrading_draft_is_named_with_its_weekly_change_and_daily_slope(played: dict[str, Any]) -> None:
    b: Server = played["b"]
    now = _in(b.truth, MONDAY, MONDAY + 7 * DAY)
    before = _counted(b, BEFORE, MONDAY)
    rate_now = sum(m.accepted for m in now) / sum(m.draft_tokens for m in now)
    rate_before = sum(m.accepted for m in before) / sum(m.draft_tokens for m in before)
    days = [_in(now, MONDAY + d * DAY, MONDAY + (d + 1) * DAY) for d in range(7)]
    rates = [sum(m.accepted for m in day) / sum(m.draft_tokens for m in day) for day in days]
    mean_x, mean_y = 3.0, sum(rates) / 7
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(rates)) / sum(
        (x - mean_x) ** 2 for x in range(7)
    )
    item = _recommended(played, "draft_degrading", "vllm-b:8000")
    assert item is not None
    data = item["data"]
    assert data["acceptance_rate"]["value"] == pytest.approx(rate_now, rel=1e-9)
    assert data["acceptance_rate"]["previous"] == pytest.approx(rate_before, rel=1e-9)
    assert data["acceptance_rate"]["change"] == pytest.approx(rate_now / rate_before - 1, rel=1e-9)
    assert data["daily_slope"] == pytest.approx(slope, rel=1e-9) and data["days"] == 7
    assert "acceptance_rate" in data["fired_on"] and data["k"] == data["k_previous"] == 3
    assert not any("k changed" in line for line in item["reasoning"])
    assert _recommended(played, "draft_degrading", "vllm-a:8000") is None


def test_every_series_holds_the_weeks_minutes_and_a_fixed_k(played: dict[str, Any]) -> None:
    for server in (played["a"], played["b"]):
        series = _series(played["report"], server.instance)
        assert series["minutes"] == len(_in(server.truth, MONDAY, MONDAY + 7 * DAY)) == 7 * 1440
        assert series["k"] == server.k and series["k_share"] is None
        # each server's one incident (A's collapse, B's KV pressure); the rules ran this week only
        assert series["headline"]["firings"] == {"value": 1.0, "previous": 0.0, "change": None}
    assert {r["rule"]: r["fired_previous"] for r in played["report"]["rules"]} == {
        "acceptance_collapse": 0,
        "kv_pressure": 0,
    }
    assert played["report"]["fallbacks"]["previous"] == {"count": 0, "seconds": 0}


def test_the_json_file_is_the_report_and_history_stays_small(played: dict[str, Any]) -> None:
    (path,) = played["paths"]
    assert json.loads(path.read_text()) == json.loads(json.dumps(played["report"]))
    # Two servers, two weeks: 40,320 minutes of history.
    assert played["size"] < 2 * 14 * 1440 * 400


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
