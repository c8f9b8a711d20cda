"""Case 3 from vLLM's histograms in history and from a bench result: tokens per chunk, ITL per
chunk and per token, the burst the mean acceptance length predicts and the smoothing interval,
each computed from the window's sums; and unknown when there is nothing to time."""

from __future__ import annotations

from typing import Any

import pytest

from specguard.playbook.diagnose import bursts
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Finding, Verdict
from specguard.store.history import HOUR
from tests.diagnose_parts import chain_parts, span

T0 = 1_764_900_000 - 1_764_900_000 % HOUR
SERVER = ("10.0.0.7:8000", "llama")


def value(finding: Finding, name: str) -> Any:
    return next(f.value for f in finding.figures if f.name == name)


def streamed(alpha: float, k: int, requests: float, chunks: float, seconds: float) -> dict[str, float]:
    """A window whose requests streamed ``chunks`` chunks after their first token, over
    ``seconds`` of inter-token intervals, at acceptance ``alpha``: every chunk after the first is
    one step, which brings the mean acceptance length."""
    parts = chain_parts(alpha, k, drafts=chunks)
    mal = 1 + parts["accepted"] / chunks
    return parts | {
        "requests": requests,
        "generation_tokens": requests + chunks * mal,
        "itl:count": chunks,
        "itl:sum": seconds,
    }


async def test_speculative_bursts_from_vllms_histograms_with_the_smoothing_interval() -> None:
    parts = streamed(0.8, 4, requests=100, chunks=9_000, seconds=9_000 * 0.030)
    mal = 1 + parts["accepted"] / 9_000
    finding = await bursts.judge(Evidence("history", T0, T0 + HOUR, servers={SERVER: [span(T0, parts)]}))
    assert finding.verdict is Verdict.CAUSE_FOUND
    assert value(finding, "tokens_per_chunk") == pytest.approx(mal)
    assert value(finding, "itl_per_chunk") == pytest.approx(30.0)
    assert value(finding, "itl_per_token") == pytest.approx(30.0 / mal)
    assert value(finding, "smoothing_interval") == pytest.approx(30.0 / mal)
    assert value(finding, "expected_burst") == pytest.approx(mal)
    assert f"release one token every {30 / mal:.1f} ms" in finding.remedy[0]
    assert f"{mal:.2f} tokens on average" in finding.summary and "speculative decoding" in finding.summary


async def test_bursts_from_a_bench_result_weighted_by_each_class_tokens() -> None:
    def phase(tpc: float, itl: float, mal: float, tokens: int) -> dict[str, Any]:
        return {
            "summary": {"tokens_per_chunk": tpc, "itl": {"mean": itl, "p50": itl},
                        "itl_per_token": {"mean": itl / tpc}, "output_tokens": tokens},
            "acceptance": {"mean_acceptance_length": mal, "rate": 0.5},
        }  # fmt: skip

    bench = {"server": {"url": "http://10.0.0.7:8000"},
             "phases": {"code": phase(3.0, 0.060, 3.1, 3000), "chat": phase(1.8, 0.036, 1.9, 1000)}}  # fmt: skip
    finding = await bursts.judge(Evidence("history", T0, T0 + HOUR, bench=bench))
    assert finding.verdict is Verdict.CAUSE_FOUND
    tpc, itl = (3.0 * 3 + 1.8) / 4, (0.060 * 3 + 0.036) / 4
    assert finding.details["overall"]["tokens_per_chunk"] == pytest.approx(tpc)  # type: ignore[index]
    assert value(finding, "smoothing_interval") == pytest.approx(itl / tpc * 1000)
    scopes = {f.scope for f in finding.figures if f.name == "tokens_per_chunk"}
    assert scopes == {"code", "chat"}
    assert all("bench --json" in f.source for f in finding.figures)


async def test_one_token_per_chunk_is_fine() -> None:
    parts = streamed(0.05, 1, requests=50, chunks=5_000, seconds=5_000 * 0.02)
    finding = await bursts.judge(Evidence("history", T0, T0 + HOUR, servers={SERVER: [span(T0, parts)]}))
    assert finding.verdict is Verdict.FINE and not finding.remedy


async def test_chunks_far_larger_than_speculation_explains_are_only_suspect() -> None:
    parts = streamed(0.1, 2, requests=10, chunks=1_000, seconds=100.0)
    parts["generation_tokens"] = 10 + 4_000.0  # 4 tokens a chunk where MAL is about 1.1
    finding = await bursts.judge(Evidence("history", T0, T0 + HOUR, servers={SERVER: [span(T0, parts)]}))
    assert finding.verdict is Verdict.SUSPECT and "joined after the engine" in finding.summary
    assert any("buffering" in step for step in finding.remedy)


async def test_without_chunk_timings_it_is_unknown() -> None:
    finding = await bursts.judge(
        Evidence("history", T0, T0 + HOUR, servers={SERVER: [span(T0, chain_parts(0.8, 3))]})
    )
    assert finding.verdict is Verdict.UNKNOWN and "inter_token_latency" in finding.missing[0]
    finding = await bursts.judge(Evidence("history", T0, T0 + HOUR, bench={"phases": {}}))
    assert finding.verdict is Verdict.UNKNOWN and "bench" in finding.missing[0]
