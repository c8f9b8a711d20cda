"""Case 1 on windows whose counters follow the chain model: each cause comes out with its numbers
(α̂, the speedup MAL / (1 + k c), the KV-cache peak, preemptions by hour), and a window without
what a verdict needs is unknown, never fine."""

from __future__ import annotations

from typing import Any

import pytest

from specguard.metrics.speedup import best_k
from specguard.playbook.diagnose import slower
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Finding, Verdict
from specguard.store.baseline import Baseline, parse_baseline
from specguard.store.history import HOUR, Span
from tests.diagnose_parts import chain_parts, kv, span

T0 = 1_764_900_000 - 1_764_900_000 % HOUR
SERVER = ("10.0.0.7:8000", "llama")


def baseline(**entry: Any) -> Baseline:
    return parse_baseline({"version": 2, "measured_at": "2026-12-01T00:00:00Z", "entries": [entry]})


def evidence(spans: list[Span], base: Baseline | None = None, hours: int = 1) -> Evidence:
    return Evidence("history", T0, T0 + hours * HOUR, servers={SERVER: spans}, baseline=base)


def value(finding: Finding, name: str) -> Any:
    return next(f.value for f in finding.figures if f.name == name)


EAGLE = baseline(speculative={"method": "eagle3"})  # c = 0.05, the heads' default


async def test_a_collapsed_acceptance_is_the_cause_with_alpha_hat_whatever_k() -> None:
    finding = await slower.judge(evidence([span(T0, chain_parts(0.2, 5) | kv(0.4))], EAGLE))
    assert finding.verdict is Verdict.CAUSE_FOUND
    assert "acceptance collapsed" in finding.summary and "α̂ 0.20 < 0.3" in finding.summary
    assert value(finding, "alpha_hat") == pytest.approx(0.2)
    # vLLM's own rate at k = 5 reads lower than α̂: alpha (1 - alpha^k) / (k (1 - alpha))
    assert value(finding, "acceptance_rate") == pytest.approx(0.2 * (1 - 0.2**5) / (5 * 0.8))
    mal = 1 + sum(0.2 ** (i + 1) for i in range(5))
    assert value(finding, "estimated_speedup") == pytest.approx(mal / (1 + 5 * 0.05))
    assert value(finding, "draft_cost") == 0.05
    assert any("change the draft" in step for step in finding.remedy)
    assert any("ladder set 0" in step for step in finding.remedy)
    # the k table says which k pays best; the remedy names it
    best = best_k([0.2 ** (i + 1) for i in range(5)], 0.05, current_k=5)
    assert best.k < 5 and any(f"lower k from 5 to {best.k}" in step for step in finding.remedy)
    table = finding.details["k_table"]
    assert isinstance(table, list)
    assert any(line.startswith(f"k = {best.k}: speedup") and "best" in line for line in table)


async def test_a_costly_draft_is_the_cause_when_acceptance_is_good() -> None:
    costly = baseline(speculative={"method": "draft_model", "draft_cost": 0.8})
    finding = await slower.judge(evidence([span(T0, chain_parts(0.7, 5) | kv(0.5))], costly))
    assert finding.verdict is Verdict.CAUSE_FOUND
    mal = (1 - 0.7**6) / 0.3
    assert value(finding, "estimated_speedup") == pytest.approx(mal / (1 + 5 * 0.8))
    assert "the draft costs too much" in finding.summary and "acceptance" not in finding.summary
    assert (
        next(f.source for f in finding.figures if f.name == "draft_cost")
        == "baseline: speculative.draft_cost"
    )
    # at c = 0.8 no k pays: fall back, or a cheaper draft
    assert best_k([0.7 ** (i + 1) for i in range(5)], 0.8).speedup < 1
    assert any("no k pays" in step for step in finding.remedy)
    assert any("cheaper" in step for step in finding.remedy)


async def test_a_draft_that_pays_at_a_lower_k_is_told_to_lower_k() -> None:
    costly = baseline(speculative={"draft_cost": 0.4})
    per_pos = [0.9, 0.5, 0.2, 0.05, 0.01]
    parts = chain_parts(0.5, 5) | {f"pos:{i}": 10_000 * p for i, p in enumerate(per_pos)}
    parts["accepted"] = 10_000 * sum(per_pos)
    finding = await slower.judge(evidence([span(T0, parts | kv(0.5))], costly))
    best = best_k(per_pos, 0.4, current_k=5)
    assert value(finding, "estimated_speedup") == pytest.approx((1 + sum(per_pos)) / (1 + 5 * 0.4))
    assert value(finding, "estimated_speedup") < 1 <= best.speedup
    assert finding.verdict is Verdict.CAUSE_FOUND and "the draft costs too much" in finding.summary
    assert any(
        f"lower k from 5 to {best.k}: expected speedup {best.speedup:.2f}x" in s for s in finding.remedy
    )


async def test_kv_cache_usage_over_95_percent_at_peak_is_pressure() -> None:
    finding = await slower.judge(evidence([span(T0, chain_parts(0.8, 3) | kv(0.97, 0.6))], EAGLE))
    assert finding.verdict is Verdict.CAUSE_FOUND
    assert "KV-cache pressure" in finding.summary and "peaked at 97 %" in finding.summary
    assert value(finding, "kv_cache_usage_peak") == pytest.approx(97.0)
    assert value(finding, "kv_cache_usage_mean") == pytest.approx(60.0)
    assert any("--max-num-seqs" in step or "lower k" in step for step in finding.remedy)


async def test_preemptions_rising_over_the_hours_is_pressure_and_steady_ones_only_suspect() -> None:
    hours = [
        span(T0 + i * HOUR, chain_parts(0.8, 3, preemptions=n) | kv(0.9)) for i, n in enumerate((0, 4, 30))
    ]
    finding = await slower.judge(evidence(hours, EAGLE, hours=3))
    assert finding.verdict is Verdict.CAUSE_FOUND
    assert "preemptions rose from 0 to 30 per hour" in finding.summary
    assert value(finding, "preemptions") == 34
    steady = [span(T0 + i * HOUR, chain_parts(0.8, 3, preemptions=5) | kv(0.9)) for i in range(3)]
    finding = await slower.judge(evidence(steady, EAGLE, hours=3))
    assert finding.verdict is Verdict.SUSPECT and "15 preemptions" in finding.summary


async def test_in_a_window_under_two_hours_preemptions_rise_from_one_quarter_to_the_next() -> None:
    minutes = [
        span(
            T0 + 60 * i,
            chain_parts(0.8, 3, drafts=100, preemptions=1.0 if i >= 45 else 0.0) | kv(0.9, samples=6),
            1,
        )
        for i in range(60)
    ]
    finding = await slower.judge(evidence(minutes, EAGLE))
    assert finding.verdict is Verdict.CAUSE_FOUND
    assert "preemptions rose from 0 to 15 per 15 min" in finding.summary
    source = next(f.source for f in finding.figures if f.name == "preemptions")
    assert source.endswith("per 15 min 0, 0, 0, 15")


async def test_a_healthy_server_is_fine_with_its_speedup() -> None:
    finding = await slower.judge(evidence([span(T0, chain_parts(0.8, 3) | kv(0.5))], EAGLE))
    assert finding.verdict is Verdict.FINE, finding.summary
    mal = 1 + 0.8 + 0.64 + 0.512
    assert f"{mal / 1.15:.2f}x" in finding.summary
    assert not finding.remedy


async def test_low_acceptance_that_still_pays_is_suspect() -> None:
    finding = await slower.judge(evidence([span(T0, chain_parts(0.4, 2) | kv(0.5))], EAGLE))
    assert finding.verdict is Verdict.SUSPECT and "acceptance is low" in finding.summary
    assert value(finding, "estimated_speedup") > 1


async def test_low_acceptance_that_does_not_pay_is_the_cause() -> None:
    costly = baseline(speculative={"draft_cost": 0.3})
    finding = await slower.judge(evidence([span(T0, chain_parts(0.4, 4) | kv(0.5))], costly))
    assert finding.verdict is Verdict.CAUSE_FOUND and "acceptance is too low to pay" in finding.summary


async def test_without_drafts_or_without_a_draft_cost_it_is_unknown_never_fine() -> None:
    finding = await slower.judge(evidence([span(T0, kv(0.5))], EAGLE))
    assert finding.verdict is Verdict.UNKNOWN and any(
        "no speculative-decoding drafts" in m for m in finding.missing
    )
    finding = await slower.judge(Evidence("history", T0, T0 + HOUR))
    assert finding.verdict is Verdict.UNKNOWN and "no vLLM server in the window's data" in finding.missing
    finding = await slower.judge(evidence([span(T0, chain_parts(0.8, 3) | kv(0.5))], None))
    assert finding.verdict is Verdict.UNKNOWN
    assert any("draft's cost" in m and "no baseline" in m for m in finding.missing)
    assert value(finding, "estimated_speedup") is None
    finding = await slower.judge(evidence([span(T0, chain_parts(0.8, 3))], EAGLE))
    assert finding.verdict is Verdict.UNKNOWN and any("KV-cache usage" in m for m in finding.missing)


def test_the_draft_cost_and_where_it_came_from() -> None:
    assert slower.draft_cost(baseline(speculative={"method": "ngram"}), *SERVER, 3) == (
        0.0, "baseline: the default for method ngram")  # fmt: skip
    measured = baseline(
        signals={"itl_p50": 0.026}, speculative={"method": "draft_model"},
        without_speculation={"signals": {"itl_p50": 0.02}},
    )  # fmt: skip
    cost, source = slower.draft_cost(measured, *SERVER, 3)
    assert cost == pytest.approx((0.026 / 0.02 - 1) / 3)
    assert "ITL p50 26.0 ms with speculation vs 20.0 ms without" in source
    cost, source = slower.draft_cost(baseline(speculative={"method": "draft_model"}), *SERVER, 3)
    assert cost is None and "set draft_cost" in source
    other = parse_baseline({"version": 2, "measured_at": "2026-12-01T00:00:00Z",
                            "entries": [{"model": "other", "speculative": {"draft_cost": 0.1}}]})  # fmt: skip
    cost, source = slower.draft_cost(other, *SERVER, 3)
    assert cost is None and "no entry for model 'llama'" in source


async def test_the_routers_series_are_not_servers() -> None:
    routes = {("10.0.0.1:80", ""): [span(T0, {"route:n:spec:chat": 50.0})]}
    finding = await slower.judge(Evidence("history", T0, T0 + HOUR, servers=routes, baseline=EAGLE))
    assert finding.verdict is Verdict.UNKNOWN and "no vLLM server in the window's data" in finding.missing
