"""A rule evaluated once over the scrape source: series selection, impossible values, per-model
baselines, the speedup estimate, target identity and warm-up, each as an operator would meet it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specguard.config.loading import LoadedRule, load
from specguard.daemon.evaluation import evaluate_rule
from specguard.rules.schema import Rule
from specguard.sources.scrape import ScrapeSource
from specguard.store.baseline import parse_baseline
from specguard.store.records import State, Verdict
from tests.pages import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    INSTANCE,
    MODEL,
    RUNNING,
    SELF_DRAFT,
    TARGET,
    Clock,
    add_many,
    add_per_position,
    set_value,
)


def rule(**fields: Any) -> LoadedRule:
    fields.setdefault("name", "r")
    fields.setdefault("window", "60s")
    return LoadedRule(Rule.model_validate(fields), "rules.yaml", 1)


def busy(text: str, accepted_by_position: list[float], drafts: float = 10.0) -> str:
    """``text`` after ``drafts`` drafts of 5 tokens with these per-position counts."""
    accepted = sum(accepted_by_position)
    text = add_many(text, {DRAFTS: drafts, DRAFT_TOKENS: 5 * drafts, ACCEPTED: accepted})
    return add_per_position(text, accepted_by_position)


def source_with(
    *pages: str, clock: Clock | None = None, targets: tuple[str, ...] = (TARGET,)
) -> ScrapeSource:
    clock = clock or Clock()
    source = ScrapeSource(targets, timeout=1.0, retention=600.0, clock=clock)
    for page in pages:
        source.ingest(targets[0], page, clock.now)
        clock.now += 15
    clock.now -= 15
    return source


async def test_a_rule_can_watch_position_0_alone_without_the_deep_positions() -> None:
    source = source_with(SELF_DRAFT, busy(SELF_DRAFT, [9, 8, 7, 4, 1]))
    first = rule(signal="acceptance_by_position", condition="< 0.5", match={"position": "0"},
                 group_by=["instance", "model_name"])  # fmt: skip
    every = rule(signal="acceptance_by_position", condition="< 0.5")
    deep = rule(signal="acceptance_by_position", condition="< 0.5", match={"position": {"=~": "[34]"}})

    one, _ = await evaluate_rule(first, source, None, {}, 1000.0, 15.0)
    all_of_them, _ = await evaluate_rule(every, source, None, {}, 1000.0, 15.0)
    selected, _ = await evaluate_rule(deep, source, None, {}, 1000.0, 15.0)

    assert [(dict(s.labels), s.value, s.state) for s in one.states.values()] == [
        ({"instance": INSTANCE, "model_name": MODEL}, 0.9, State.INACTIVE)
    ]
    firing = sorted(s.labels["position"] for s in all_of_them.states.values() if s.state is State.FIRING)
    assert firing == ["3", "4"]  # the deep positions are naturally low: why a rule selects
    assert sorted(s.labels["position"] for s in selected.states.values()) == ["3", "4"]


async def test_an_impossible_value_is_an_error_with_the_reason_never_a_breach() -> None:
    negative = set_value(SELF_DRAFT, RUNNING, -5)
    source = source_with(negative, negative)
    outcome, _ = await evaluate_rule(
        rule(signal="running_requests", condition="< 1"), source, None, {}, 1000.0, 15.0
    )
    (state,) = outcome.states.values()
    assert (state.state, state.verdict) == (State.INACTIVE, Verdict.ERROR)
    assert state.error == "running_requests = -5 is impossible (must be >= 0): check the target's /metrics"


async def test_negative_counters_give_an_error_not_acceptance_minus_131() -> None:
    broken = add_many(SELF_DRAFT, {DRAFTS: 10.0, DRAFT_TOKENS: 50.0, ACCEPTED: -6550.0})
    source = source_with(SELF_DRAFT, broken)
    outcome, _ = await evaluate_rule(
        rule(signal="acceptance_rate", condition="< 0.3"), source, None, {}, 1000.0, 15.0
    )
    (state,) = outcome.states.values()
    assert state.verdict is Verdict.ERROR and state.state is State.INACTIVE
    assert "acceptance_rate" in (state.error or "") and "impossible" in (state.error or "")


async def test_a_latency_rule_judges_each_model_against_its_own_baseline() -> None:
    baseline = parse_baseline(
        {
            "version": 2,
            "measured_at": "2026-11-30T10:00:00Z",
            "entries": [{"model": "other-model", "signals": {"e2e_latency_p95": 0.1}}],
        }
    )
    source = source_with(SELF_DRAFT, SELF_DRAFT)
    latency = rule(signal="running_requests", condition="> 1.2 * baseline.e2e_latency_p95")
    outcome, _ = await evaluate_rule(latency, source, baseline, {}, 1000.0, 15.0)
    (state,) = outcome.states.values()
    assert state.verdict is Verdict.ERROR  # tiny-llama is not other-model: no threshold, no breach
    assert state.error == "the baseline has no entry for model 'tiny-llama' and no default entry"
    assert outcome.error is None


async def test_estimated_speedup_is_the_acceptance_length_over_one_plus_k_c() -> None:
    baseline = parse_baseline(
        {
            "version": 2,
            "measured_at": "2026-11-30T10:00:00Z",
            "entries": [{"model": MODEL, "speculative": {"draft_cost": 0.2}}],
        }
    )
    source = source_with(SELF_DRAFT, busy(SELF_DRAFT, [6, 3, 1, 0, 0]))  # 10 of 50 accepted
    speedup = rule(signal="estimated_speedup", condition="< 1.0")
    outcome, _ = await evaluate_rule(speedup, source, baseline, {}, 1000.0, 15.0)
    (state,) = outcome.states.values()
    # mean acceptance length 1 + 10/10 = 2; k = 5 positions; 2 / (1 + 5 * 0.2) = 1.0
    assert state.value == pytest.approx(1.0)
    assert state.verdict is Verdict.OK
    no_cost, _ = await evaluate_rule(speedup, source, None, {}, 1000.0, 15.0)
    assert no_cost.error is not None and "needs the draft's cost" in no_cost.error


def test_two_targets_on_one_host_and_port_need_names_and_check_says_so(tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "sources:\n  scrape:\n    targets:\n"
        "      - http://10.0.0.5:8000/ok\n"
        "      - http://10.0.0.5:8000/lowacc\n"
    )
    loaded = load(config)
    assert [p.field for p in loaded.errors] == ["sources.scrape.targets"]
    assert (
        "would both report as instance '10.0.0.5:8000': give them distinct names" in loaded.errors[0].message
    )
    config.write_text(
        "sources:\n  scrape:\n    targets:\n"
        "      - http://10.0.0.5:8000/ok\n"
        "      - {url: http://10.0.0.5:8000/lowacc, name: lowacc}\n"
    )
    assert load(config).ok


async def test_named_targets_keep_their_own_series() -> None:
    clock = Clock()
    ok, low = "http://10.0.0.5:8000/ok", "http://10.0.0.5:8000/lowacc"
    source = ScrapeSource([ok, low], timeout=1.0, retention=600.0, clock=clock, names={low: "lowacc"})
    for page_ok, page_low in (
        (SELF_DRAFT, SELF_DRAFT),
        (busy(SELF_DRAFT, [8, 8, 8, 8, 8]), busy(SELF_DRAFT, [1, 0, 0, 0, 0])),
    ):
        source.ingest(ok, page_ok, clock.now)
        source.ingest(low, page_low, clock.now)
        clock.now += 15
    clock.now -= 15
    outcome, _ = await evaluate_rule(
        rule(signal="acceptance_rate", condition="< 0.5"), source, None, {}, clock.now, 15.0
    )
    values = {s.labels["instance"]: s.value for s in outcome.states.values()}
    assert values == {
        "10.0.0.5:8000": pytest.approx(0.8),
        "lowacc": pytest.approx(0.02),
    }  # not one merged 0.41


async def test_a_target_not_yet_scraped_twice_is_warming_up_and_a_dead_one_is_not() -> None:
    clock = Clock()
    alive, dead = "http://a:8000/metrics", "http://b:8000/metrics"
    source = ScrapeSource([alive, dead], timeout=1.0, retention=600.0, clock=clock)
    assert source.warming_up() == {"a:8000", "b:8000"}  # nothing scraped yet
    source.ingest(alive, SELF_DRAFT, clock.now)
    source.ingest(dead, "not an exposition {", clock.now)
    assert source.warming_up() == {"a:8000"}  # one sample: no rate yet; b answered garbage: down
    clock.now += 15
    source.ingest(alive, SELF_DRAFT, clock.now)
    assert source.warming_up() == frozenset()
