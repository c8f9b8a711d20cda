"""Streams that arrive in bursts (the server's front end or the client held up, several engine
steps' chunks at once) do not time the engine's steps by their chunks: a run on a busy host showed
the plain server's TPOT at 0.0 ms, and `tune` then measured speculation as 0.21x and a draft cost of
286. Such runs are told apart (chunk gaps too short to be steps), the draft cost is not taken from
their gaps, and speeds are compared by the whole request's time per output token instead."""

from __future__ import annotations

import pytest

from specguard.playbook.bench import runner, stats
from specguard.playbook.bench.client import Result
from specguard.playbook.tune.measure import Figures, Run, figures
from specguard.playbook.tune.table import plain_text
from specguard.playbook.tune.verdict import Verdict, decide


def result(ttft: float, gaps: list[float], tokens_per_chunk: int = 1) -> Result:
    made = Result("chat", 0.0, ok=True, ttft=ttft, e2e=ttft + sum(gaps))
    made.gaps, made.gap_tokens = list(gaps), [tokens_per_chunk] * len(gaps)
    made.output_tokens = 1 + tokens_per_chunk * len(gaps)
    return made


def steady(step: float, tokens_per_chunk: int = 1) -> list[Result]:
    return [result(0.02, [step] * 31, tokens_per_chunk) for _ in range(8)]


def bursty() -> list[Result]:
    # 31 steps of 3 ms each, but the chunks reached the client together at the end
    return [result(0.02 + 31 * 0.003, [0.00001] * 31) for _ in range(8)]


def phase(results: list[Result]) -> dict[str, object]:
    return {"summary": stats.summarize(results, 1.0), "results": results, "acceptance": None}


def test_the_share_of_gaps_too_short_to_be_steps() -> None:
    assert stats.burst_share(steady(0.003)) == 0.0
    assert stats.burst_share(bursty()) == 1.0
    mixed = [result(0.02, [0.003, 0.00005, 0.003, 0.00001])]
    assert stats.burst_share(mixed) == 0.5
    assert stats.burst_share([Result("chat", 0.0)]) is None  # nothing answered: no gaps to judge


def server(positions: int, results: list[Result]) -> runner.Server:
    made = runner.Server("http://127.0.0.1:8000", "tiny-llama", "0.32.0", 1024)
    made.positions, made.phases = positions, {"chat": phase(results)}
    return made


def test_bench_against_takes_no_draft_cost_from_streams_that_came_in_bursts() -> None:
    # a step of k = 4 costs 1.4 plain steps: c = 0.1
    found = runner.compare(server(4, steady(0.0042, 3)), server(0, steady(0.003)))
    assert found["chat"]["draft_cost"] == pytest.approx(0.1)
    found = runner.compare(server(4, steady(0.0042, 3)), server(0, bursty()))
    assert "draft_cost" not in found["chat"]
    assert found["chat"]["draft_cost_unknown"] == (
        "the plain server's streams arrived in bursts (100% of chunk gaps under 0.2 ms): their chunk "
        "gaps do not time engine steps"
    )


def run(k: int, results: list[Result]) -> Run:
    made: Figures = figures(phase(results))
    return Run(k, 2, {"chat": made}, "0.32.0", k, {})


def test_a_sweep_with_bursts_compares_the_whole_requests_time_per_token() -> None:
    # The plain run came in bursts: by its TPOT (about 0) it would be the fastest of all.
    reference = {2: run(0, bursty())}
    runs = {1: {2: run(1, steady(0.0022, 2))}, 3: {2: run(3, steady(0.0012, 3))}}
    verdict = decide(Verdict((1, 3), (2,), runs, reference, {}))
    assert verdict.bursts(2) == {"off": {"chat": 1.0}}
    plain_e2e = reference[2].classes["chat"].pooled_e2e
    k3_e2e = runs[3][2].classes["chat"].pooled_e2e
    assert plain_e2e is not None and k3_e2e is not None
    assert verdict.measured(3, 2, "chat") == pytest.approx(plain_e2e / k3_e2e)
    assert verdict.measured(3, 2, "chat") > verdict.measured(1, 2, "chat") > 1  # type: ignore[operator]
    assert verdict.recommended == 3
    text = plain_text(verdict)
    assert (
        "  streams that arrived in bursts (chunk gaps under 0.2 ms: k=off chat 100%): their TPOT does not "
        "time the engine's steps, so SPEEDUP and the best k compare the whole request's time per output "
        "token (prefill included)\n"
    ) in text


def test_without_bursts_the_speeds_are_the_pooled_tpot() -> None:
    reference = {2: run(0, steady(0.003))}
    runs = {1: {2: run(1, steady(0.0022, 2))}, 3: {2: run(3, steady(0.0012, 3))}}
    verdict = decide(Verdict((1, 3), (2,), runs, reference, {}))
    assert verdict.bursts(2) == {}
    assert verdict.measured(3, 2, "chat") == pytest.approx(0.003 / (0.0012 / 3))
    assert "bursts" not in plain_text(verdict)
