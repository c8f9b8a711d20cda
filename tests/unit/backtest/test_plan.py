"""How each rule is replayed, and what it is told it cannot show: history's minutes change a fast
rule's timing and a detector's windows; some rules cannot be replayed from history at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.backtest.plan import HISTORY, PROMETHEUS, plans
from specguard.config.loading import load

RULES = """
rules:
  - name: fast
    signal: acceptance_rate
    window: 30s
    interval: 15s
    consecutive: 3
    condition: "< 0.4"
  - name: slow
    signal: acceptance_rate
    window: 90s
    interval: 2m
    condition: "< 0.4"
  - name: detector
    signal: token_acceptance
    interval: 5s
    detect: {drop: [0.12, 0.3], false_alarm_every: 30d}
  - name: raw
    expr: "sum(rate(vllm:num_preemptions_total[5m]))"
    condition: "> 1"
  - name: alerted
    alert: {match: {alertname: VLLMDown}}
"""


@pytest.fixture
def loaded(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "specguard.yaml").write_text("sources: {prometheus: {url: http://127.0.0.1:9090}}\n")
    got = load(tmp_path / "specguard.yaml", [str(tmp_path / "rules.yaml")])
    assert got.ok, got.problems
    return got


def test_from_history_a_rule_faster_than_a_minute_is_evaluated_once_a_minute_and_says_so(loaded) -> None:  # type: ignore[no-untyped-def]
    by = {p.name: p for p in plans(loaded, HISTORY)}
    fast = by["fast"]
    assert (fast.live_every, fast.every, fast.skip) == (15.0, 60.0, None)
    assert any("window 30s reads the last whole minute" in n for n in fast.notes)
    assert any(
        "`consecutive: 3` counts minutes here: a firing up to 1m30s later than live" in n for n in fast.notes
    )
    slow = by["slow"]
    assert slow.every == 120.0 and any("window 1m30s reads the 2m that cover it" in n for n in slow.notes)


def test_a_detector_faster_than_a_minute_is_replayed_on_minute_windows_with_its_h(loaded) -> None:  # type: ignore[no-untyped-def]
    detector = next(p for p in plans(loaded, HISTORY) if p.name == "detector")
    assert (detector.live_every, detector.every) == (5.0, 60.0)
    assert detector.item.rule.interval == 60.0  # the rule as replayed
    (windows, warmup) = detector.notes
    assert "its 5s windows are replayed as 1m windows" in windows
    assert "h = 11.77 here against 14.26 live" in windows  # ln(30d/60s) + ln 3 and ln(30d/5s) + ln 3
    assert "warm-up (1h) starts at the period's start" in warmup


def test_what_history_cannot_replay_is_skipped_with_the_reason_and_prometheus_replays_it(loaded) -> None:  # type: ignore[no-untyped-def]
    by = {p.name: p for p in plans(loaded, HISTORY)}
    assert by["raw"].skip == "a rule on raw PromQL replays only from Prometheus (--from-prometheus URL)"
    assert by["alerted"].skip is not None and "Alertmanager" in by["alerted"].skip
    from_prometheus = {p.name: p for p in plans(loaded, PROMETHEUS)}
    assert from_prometheus["raw"].skip is None and from_prometheus["raw"].every == 15.0
    assert from_prometheus["fast"].every == 15.0 and from_prometheus["fast"].notes == ()
    assert from_prometheus["detector"].every == 5.0
    assert from_prometheus["alerted"].skip is not None
    assert [p.name for p in plans(loaded, HISTORY, ("slow",))] == ["slow"]
