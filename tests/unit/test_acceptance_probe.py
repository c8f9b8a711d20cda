"""What the remedy checks read off a real vLLM 0.32.0 page (actions/acceptance.py), and Wald's test
driven round by round from pages."""

from __future__ import annotations

from pathlib import Path

from actions.acceptance import SprtParams, sprt_probe, totals
from common.sequential import Decision

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_the_counters_of_a_real_page_with_the_last_position_as_the_drafts_accepted_whole() -> None:
    page = (FIXTURES / "vllm-0.32.0-cpu-metrics-self-draft.prom").read_text()
    seen = totals(page)
    assert (seen.accepted, seen.drafts, seen.draft_tokens) == (188, 245, 1225)
    assert seen.full == 33 and seen.expected_tokens == 245 * 5
    rejecting = totals((FIXTURES / "vllm-0.32.0-cpu-metrics-rejecting-draft.prom").read_text())
    assert (rejecting.accepted, rejecting.full, rejecting.expected_tokens) == (0, 0, 298 * 4)


def page(accepted: float, drafts: float, full: float, k: int = 4, draft_tokens: float | None = None) -> str:
    labels = 'engine="0",model_name="m"'
    tokens = drafts * k if draft_tokens is None else draft_tokens
    positions = [full] * k  # only the smallest (last) position matters here
    return (
        "\n".join(
            [
                "# TYPE vllm:spec_decode_num_drafts counter",
                f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {tokens}",
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                *(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {v}'
                    for i, v in enumerate(positions)
                ),
            ]
        )
        + "\n"
    )


async def _run(pages: list[str], rounds: int = 8) -> tuple[Decision, str, int]:
    params = SprtParams(in_control=0.8, shift_to=0.4, rounds=rounds)
    served = iter(pages)
    sent = 0

    async def metrics() -> str:
        return next(served)

    async def send() -> None:
        nonlocal sent
        sent += 1

    verdict = await sprt_probe(params, metrics, send, "check")
    return verdict.decision, verdict.detail, sent


async def test_the_test_stops_at_the_first_round_that_decides() -> None:
    # Each round: 10 drafts, 30 accepted, 5 whole -> S = 30, F = 5: alpha-hat 0.86, recovered.
    pages = [page(30 * i, 10 * i, 5 * i) for i in range(0, 9)]
    decision, detail, sent = await _run(pages)
    assert decision is Decision.RECOVERED and sent == 1
    assert "per-token acceptance 0.86 over 35 trials in 1 round(s)" in detail
    # Each round: 10 drafts, 4 accepted, none whole -> S = 4, F = 10: collapsed.
    decision, _, sent = await _run([page(4 * i, 10 * i, 0) for i in range(0, 9)])
    assert decision is Decision.COLLAPSED and sent == 1


async def test_a_restarted_server_or_short_drafts_decide_nothing() -> None:
    decision, detail, _ = await _run([page(100, 50, 10), page(5, 3, 1)])
    assert decision is Decision.UNDECIDED and "counters went back" in detail
    decision, detail, _ = await _run([page(0, 0, 0), page(6, 10, 1, draft_tokens=25)])
    assert decision is Decision.UNDECIDED and "fewer tokens than k" in detail
    decision, detail, sent = await _run([page(0, 0, 0)] * 4, rounds=3)
    assert decision is Decision.UNDECIDED and sent == 3 and "no drafts in 3 round(s)" in detail
