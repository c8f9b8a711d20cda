"""Acceptance measured by specguard's scrape source equals the ground truth and the configured model.

Statistics: with i.i.d. conditional acceptance alpha and k draft tokens, the accepted count N of one
draft has P(N >= j) = alpha^j (j = 1..k). vLLM's acceptance rate is sum(N) / (k * drafts), with
expectation alpha (1 - alpha^k) / (k (1 - alpha)) (speculative-math.md section 3) and standard
deviation sqrt(Var N / drafts) / k; per position i the share of drafts reaching it is a binomial
proportion with p = alpha^(i+1). Every comparison with the model allows 4 standard deviations,
computed from the number of drafts actually measured: a false failure has odds of about 1 in 16,000
per comparison (and the seed is fixed, so a passing run stays passing).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import aiohttp
import pytest

from specguard.sim.engine.records import RequestRecord
from specguard.sim.server import Simulator
from tests.sim.simclient import (
    completion,
    expected_acceptance_rate,
    four_sigma_rate,
    four_sigma_share,
    measure,
    running,
    speculative,
)

K = 4


async def _traffic(
    session: aiohttp.ClientSession, sim: Simulator, requests: int, temperature: float, concurrency: int = 16
) -> list[RequestRecord]:
    """``requests`` non-streamed completions, ``concurrency`` at a time; their ground truth."""
    limit = asyncio.Semaphore(concurrency)
    ids: list[str] = []

    async def one() -> None:
        async with limit:
            result: dict[str, Any] = await completion(
                session, sim, max_tokens=160, ignore_eos=True, temperature=temperature
            )
            ids.append(result["id"])

    await asyncio.gather(*(one() for _ in range(requests)))
    wanted = set(ids)
    return [record for record in sim.ground_truth() if record.id in wanted]


def _truth(records: list[RequestRecord]) -> tuple[int, int, int, list[int]]:
    """(drafts, draft tokens, accepted tokens, drafts reaching each position) from the ground truth."""
    drafted = [step for record in records for step in record.steps if step.draft_tokens]
    reached = [sum(1 for step in drafted if step.accepted > i) for i in range(K)]
    return len(drafted), sum(s.draft_tokens for s in drafted), sum(s.accepted for s in drafted), reached


async def test_scraped_acceptance_equals_the_ground_truth_and_the_model(
    session: aiohttp.ClientSession,
) -> None:
    alpha = 0.7
    async with running(speculative=speculative(K), acceptance_by_position=[alpha], seed=11) as sim:
        records: list[RequestRecord] = []

        async def traffic() -> None:
            records.extend(await _traffic(session, sim, requests=48, temperature=0.0))

        measured = await measure(sim, traffic())

    drafts, draft_tokens, accepted, reached = _truth(records)
    assert drafts > 2000  # enough for the tolerances below to be tight (~0.02)
    # Exactly the ground truth (rates divide by the same scrape interval: equal up to rounding).
    assert math.isclose(measured.acceptance_rate, accepted / draft_tokens, rel_tol=1e-12)
    assert math.isclose(measured.mean_acceptance_length, 1 + accepted / drafts, rel_tol=1e-12)
    for position in range(K):
        assert math.isclose(measured.by_position[position], reached[position] / drafts, rel_tol=1e-12)

    # And the model: vLLM's rate is below alpha for k > 1; p_i = alpha^(i+1).
    expected = expected_acceptance_rate(alpha, K)
    assert abs(measured.acceptance_rate - expected) < four_sigma_rate(alpha, K, drafts), (measured, expected)
    for position in range(K):
        p = alpha ** (position + 1)
        assert abs(measured.by_position[position] - p) < four_sigma_share(p, drafts), (position, measured)


async def test_position_dependent_acceptance_gives_cumulative_per_position_shares(
    session: aiohttp.ClientSession,
) -> None:
    conditional = [0.9, 0.6, 0.5, 0.3]
    async with running(speculative=speculative(K), acceptance_by_position=conditional, seed=5) as sim:
        records: list[RequestRecord] = []

        async def traffic() -> None:
            records.extend(await _traffic(session, sim, requests=32, temperature=0.0))

        measured = await measure(sim, traffic())
    drafts = _truth(records)[0]
    p = 1.0
    for position, a in enumerate(conditional):
        p *= a  # vLLM's per-position share is the product of the conditional rates (EAGLE's n-alpha)
        assert abs(measured.by_position[position] - p) < four_sigma_share(p, drafts), (position, measured)


async def test_a_higher_temperature_lowers_acceptance_by_the_decay_law(
    session: aiohttp.ClientSession,
) -> None:
    alpha0, decay = 0.9, 0.5
    async with running(
        speculative=speculative(K), acceptance_by_position=[alpha0], temperature_decay=decay, seed=7
    ) as sim:
        cold: list[RequestRecord] = []
        hot: list[RequestRecord] = []

        async def traffic(temperature: float, into: list[RequestRecord]) -> None:
            into.extend(await _traffic(session, sim, requests=32, temperature=temperature))

        at_zero = await measure(sim, traffic(0.0, cold))
        at_hot = await measure(sim, traffic(1.5, hot))

    alpha_hot = alpha0 * math.exp(-decay * 1.5)  # 0.425
    assert at_hot.acceptance_rate < at_zero.acceptance_rate
    for measured, alpha, records in ((at_zero, alpha0, cold), (at_hot, alpha_hot, hot)):
        drafts = _truth(records)[0]
        expected = expected_acceptance_rate(alpha, K)
        assert abs(measured.acceptance_rate - expected) < four_sigma_rate(alpha, K, drafts), (
            measured,
            expected,
        )


def _per_request_alpha(record: RequestRecord) -> tuple[float, float]:
    """(α̂, trials) of one request under the chain model: S / (S + F)."""
    drafted = [step for step in record.steps if step.draft_tokens]
    successes = sum(step.accepted for step in drafted)
    failures = sum(1 for step in drafted if step.accepted < step.draft_tokens)
    return successes / (successes + failures), successes + failures


async def test_with_a_spread_each_request_has_its_own_acceptance_around_the_configured_one(
    session: aiohttp.ClientSession,
) -> None:
    # Requests differ: with --acceptance-spread 0.1 their per-token acceptance is a Beta around
    # 0.7 with that standard deviation; without it every request draws from the same 0.7.
    spread: dict[float, list[tuple[float, float]]] = {}
    for sd in (0.0, 0.1):
        options = {"acceptance_by_position": [0.7], "acceptance_spread": sd, "seed": 21}
        async with running(speculative=speculative(K), **options) as sim:
            records = await _traffic(session, sim, requests=64, temperature=0.0)
        spread[sd] = [_per_request_alpha(record) for record in records]
    for sd, per_request in spread.items():
        alphas = [a for a, _ in per_request]
        mean_trials = sum(t for _, t in per_request) / len(per_request)
        binomial_sd = math.sqrt(0.7 * 0.3 / mean_trials)
        observed_sd = math.sqrt(sum((a - 0.7) ** 2 for a in alphas) / len(alphas))
        assert abs(sum(alphas) / len(alphas) - 0.7) < 4 * math.sqrt(sd**2 + binomial_sd**2) / math.sqrt(
            len(alphas)
        )
        expected_sd = math.sqrt(sd**2 + binomial_sd**2)
        assert observed_sd == pytest.approx(expected_sd, rel=0.35), (sd, observed_sd, expected_sd)


def test_a_spread_no_beta_can_have_is_refused() -> None:
    from specguard.sim.options import OptionsError, SimOptions

    with pytest.raises(
        OptionsError, match=r"acceptance spread: no Beta distribution has mean 0\.7 and spread 0\.5"
    ):
        SimOptions(acceptance_by_position=[0.7], acceptance_spread=0.5)
    with pytest.raises(OptionsError, match="acceptance spread must be >= 0"):
        SimOptions(acceptance_spread=-0.1)
