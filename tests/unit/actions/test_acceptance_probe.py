"""What the remedy checks read off a real vLLM 0.32.0 page (actions/acceptance.py), and Wald's test
driven round by round from pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specguard.actions.acceptance import ImpossibleCounters, SprtParams, sprt_probe, totals
from specguard.common.sequential import Decision, Sprt
from specguard.sim.model import beta_parameters

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


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

    verdict = await sprt_probe(params, metrics, send, "check", max_tokens=16)
    return verdict.decision, verdict.detail, sent


async def test_the_test_stops_at_the_first_round_that_decides() -> None:
    # Each round: 10 drafts, 30 accepted, 5 whole -> S = 30, F = 5: alpha-hat 0.86, recovered.
    pages = [page(30 * i, 10 * i, 5 * i) for i in range(0, 9)]
    decision, detail, sent = await _run(pages)
    assert decision is Decision.RECOVERED and sent == 1
    assert "per-token acceptance 0.86 over 35 trials in 1 round(s)" in detail
    # 16 tokens a request, spread 0.15: 1 + 15 x 0.0225 / (0.8 x 0.2) = 3.11, the larger of the
    # two hypotheses' (0.8's: a spread weighs more where acceptance varies less).
    assert detail.endswith("(phi 3.11 per round)")
    # Each round: 20 drafts, 8 accepted, none whole -> S = 8, F = 20: collapsed.
    decision, _, sent = await _run([page(8 * i, 20 * i, 0) for i in range(0, 9)])
    assert decision is Decision.COLLAPSED and sent == 1
    # Half of it is evidence 2.64 a round, short of the bound 2.99: a second round decides.
    decision, _, sent = await _run([page(4 * i, 10 * i, 0) for i in range(0, 9)])
    assert decision is Decision.COLLAPSED and sent == 2


async def test_a_restarted_server_or_short_drafts_decide_nothing() -> None:
    decision, detail, _ = await _run([page(100, 50, 10), page(5, 3, 1)])
    assert decision is Decision.UNDECIDED and "counters went back" in detail
    decision, detail, _ = await _run([page(0, 0, 0), page(6, 10, 1, draft_tokens=25)])
    assert decision is Decision.UNDECIDED and "fewer tokens than k" in detail
    decision, detail, sent = await _run([page(0, 0, 0)] * 4, rounds=3)
    assert decision is Decision.UNDECIDED and sent == 3 and "no drafts in 3 round(s)" in detail


K = 4


def rounds(
    rng: np.random.Generator, runs: int, requests: int, max_tokens: int, mean: float, spread: float
) -> tuple[np.ndarray, np.ndarray]:
    """(S, F) of one round of each of ``runs`` tests: ``requests`` requests, each with its own α
    drawn as the simulator draws it (a Beta of mean ``mean`` and standard deviation ``spread``),
    making chain drafts of K tokens until ``max_tokens`` tokens; every draft begun is counted, as
    vLLM counts what it verified."""
    a, b = beta_parameters(mean, spread)
    alpha = rng.beta(a, b, (runs, requests))[..., None]
    accepted = np.minimum(rng.geometric(1 - alpha, (runs, requests, max_tokens)) - 1, K)
    begun = np.cumsum(accepted + 1, axis=-1) - accepted - 1 < max_tokens
    return (accepted * begun).sum(axis=(1, 2)), ((accepted < K) & begun).sum(axis=(1, 2))


def decisions(sprt: Sprt, truth: float, requests: int, max_tokens: int, spread: float) -> list[float]:
    """Shares of 4,000 tests on traffic at ``truth`` that end collapsed, recovered, undecided
    (after 8 rounds, the default)."""
    rng = np.random.default_rng(int(truth * 1000) + max_tokens)
    runs = 4000
    total, decided = np.zeros(runs), np.zeros(runs)  # decided: +1 collapsed, -1 recovered
    for _ in range(8):
        s, f = rounds(rng, runs, requests, max_tokens, truth, spread)
        total += np.where(
            decided == 0, [sprt.evidence(float(x), float(y)) for x, y in zip(s, f, strict=True)], 0
        )
        decided = np.where((decided == 0) & (total >= sprt.upper), 1, decided)
        decided = np.where((decided == 0) & (total <= sprt.lower), -1, decided)
    return [float(np.mean(decided == v)) for v in (1, -1, 0)]


@pytest.mark.parametrize(("requests", "max_tokens"), [(4, 64), (4, 16), (1, 64)])
def test_the_stated_error_rates_hold_on_rounds_of_requests_that_differ(
    requests: int, max_tokens: int
) -> None:
    # Each request's own acceptance a Beta of spread 0.15 (the default) around the truth: a round's
    # tokens vary several times as much as binomial ones. Hypotheses close enough for it to matter.
    params = SprtParams(in_control=0.75, shift_to=0.62)
    sprt = params.test(max_tokens)
    assert sprt.phi == pytest.approx(1 + (max_tokens - 1) * 0.15**2 / (0.75 * 0.25))
    collapsed, _, _ = decisions(sprt, 0.75, requests, max_tokens, 0.15)
    _, recovered, _ = decisions(sprt, 0.62, requests, max_tokens, 0.15)
    # At most the stated rates (0.05 and 0.01); 4,000 tests put the sampling error near 0.0035.
    assert collapsed <= 0.05 and recovered <= 0.01, (collapsed, recovered)
    # Taken as independent tokens (phi 1), the same rounds break both several times over.
    naive = SprtParams(in_control=0.75, shift_to=0.62, phi=1.0).test(max_tokens)
    wrong_collapse, _, _ = decisions(naive, 0.75, requests, max_tokens, 0.15)
    _, wrong_recovery, _ = decisions(naive, 0.62, requests, max_tokens, 0.15)
    assert wrong_collapse > 2 * 0.05 and wrong_recovery > 2 * 0.01, (wrong_collapse, wrong_recovery)


def test_the_detectors_long_run_phi_would_leave_a_collapse_undecided() -> None:
    # The collapse detector's phi (50-100 on the benchmark's traffic) counts requests spread over
    # many 5 s windows; a round of 4 requests of 16 tokens carries a few dozen trials, and divided
    # by it, even a collapse to 0.45 does not move the test in 8 rounds.
    sprt = SprtParams(in_control=0.75, shift_to=0.45, phi=70.0).test(16)
    _, _, undecided = decisions(sprt, 0.45, 4, 16, 0.1)
    assert undecided > 0.9
    right = SprtParams(in_control=0.75, shift_to=0.45).test(16)
    collapsed, _, undecided = decisions(right, 0.45, 4, 16, 0.1)
    assert collapsed > 0.99 and undecided < 0.01


@pytest.mark.parametrize(
    ("pages", "reason"),
    [
        ([page(0, 0, 0), page(900, 20, 0)], "acceptance 11.25 is impossible"),
        ([page(0, 0, 0), page(10, 20, 30)], "30 drafts accepted whole of 20 drafted is impossible"),
        ([page(0, 0, 0), page(-5, 20, 0)], "counts -5 accepted tokens: not a count"),
        (["<html>not metrics</html>"], "GET /metrics is not a Prometheus page"),
    ],
)
async def test_every_probe_refuses_counters_that_cannot_be_so(pages: list[str], reason: str) -> None:
    """The canary's and the restart's probes read pages through the same checks."""
    with pytest.raises(ImpossibleCounters, match=reason):
        await _run(pages)
