"""The restore's canary against a served OpenAI API with vLLM's spec_decode counters (the
simulator: its acceptance is set here, which a real server's is not), and a feature_flag restore it
gates. The real vLLM runs the same probe in tests/e2e."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specguard.actions.base import ActionContext
from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.feature_flag.canary import Canary, CanaryParams
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.store.database import Store
from specguard.store.memory import StoreMemory


async def simulator(acceptance: list[float] | None) -> Simulator:
    options = SimOptions(
        port=0,
        speculative=SpeculativeConfig("draft_model", "tiny-draft", 3) if acceptance else None,
        acceptance_by_position=acceptance or [0.8],
        step_time=0.002,
        seed=7,
    )
    return await start_simulator(options)


@pytest.fixture
async def good() -> AsyncIterator[Simulator]:
    sim = await simulator([0.95, 0.9, 0.9])
    yield sim
    await sim.stop()


@pytest.fixture
async def poor() -> AsyncIterator[Simulator]:
    sim = await simulator([0.2, 0.2, 0.2])
    yield sim
    await sim.stop()


async def test_the_canary_measures_acceptance_for_its_own_requests(good: Simulator, poor: Simulator) -> None:
    passed = await Canary(CanaryParams(url=good.url, min_acceptance=0.6, requests=4), None).probe()
    assert passed.ok, passed.detail
    assert passed.acceptance is not None and passed.acceptance > 0.6 and passed.drafted >= 32
    failed = await Canary(CanaryParams(url=poor.url, min_acceptance=0.6, requests=4), None).probe()
    assert not failed.ok
    assert failed.acceptance is not None and failed.acceptance < 0.6
    assert f"acceptance {failed.acceptance:.2f} over" in failed.detail and "below 0.6" in failed.detail


async def test_the_canary_says_when_there_is_no_speculation_to_measure(unused_tcp_port: int) -> None:
    plain = await simulator(None)
    try:
        result = await Canary(CanaryParams(url=plain.url, min_acceptance=0.5), None).probe()
    finally:
        await plain.stop()
    assert not result.ok and "is speculative decoding on at this server?" in result.detail
    gone = await Canary(
        CanaryParams(url=f"http://127.0.0.1:{unused_tcp_port}", min_acceptance=0.5), None
    ).probe()
    assert not gone.ok and gone.detail.startswith(
        f"canary: http://127.0.0.1:{unused_tcp_port}: ClientConnector"
    )


async def test_a_restore_waits_for_the_canary(poor: Simulator, good: Simulator, tmp_path: Path) -> None:
    store = Store(tmp_path / "specguard.db")
    await store.open()
    try:
        flag = tmp_path / "flags.json"

        def action(url: str) -> FeatureFlagAction:
            raw = {
                "type": "feature_flag",
                "file": {
                    "path": str(flag),
                    "engage": {"speculative": False},
                    "restore": {"speculative": True},
                },
                "canary": {"url": url, "min_acceptance": 0.6},
                "restore_backoff": "1m",
            }
            return FeatureFlagAction("fallback", FeatureFlagParams.model_validate(raw))

        labels = {"instance": "h"}
        ctx = ActionContext(
            "low", "firing", "critical", labels, 0.2, 0.5, "s", series=json.dumps(labels),
            memory=StoreMemory(store, "fallback"),
        )  # fmt: skip
        assert (await action(poor.url).run(ctx)).ok
        held = await action(poor.url).restore(ctx)
        assert not held.ok and held.retry_after == 60.0
        assert "below 0.6; the fallback stays engaged, next try in 1m" in held.detail
        assert json.loads(flag.read_text()) == {"speculative": False}
        done = await action(good.url).restore(ctx)
        assert done.ok and "canary: acceptance" in done.detail, done.detail
        assert json.loads(flag.read_text()) == {"speculative": True}
    finally:
        await store.close()


async def test_the_canary_sends_its_requests_at_the_configured_temperature() -> None:
    # One draft, acceptance falling with temperature as a real one's does: judged at temperature
    # 0 it passes, at a hot traffic's temperature it does not.
    options = SimOptions(port=0, speculative=SpeculativeConfig("draft_model", "tiny-draft", 3),
                         acceptance_by_position=[0.9], temperature_decay=1.2, step_time=0.002, seed=7)  # fmt: skip
    sim = await start_simulator(options)
    try:
        cold = await Canary(CanaryParams(url=sim.url, min_acceptance=0.6), None).probe()
        hot = await Canary(CanaryParams(url=sim.url, min_acceptance=0.6, temperature=1.5), None).probe()
    finally:
        await sim.stop()
    assert cold.ok, cold.detail
    assert not hot.ok and hot.acceptance is not None and hot.acceptance < 0.3, hot.detail
    with pytest.raises(ValueError, match="temperature"):
        CanaryParams(url=sim.url, min_acceptance=0.6, temperature=-0.1)


SPRT = {"in_control": 0.85, "shift_to": 0.4, "false_recovery": 0.01, "false_collapse": 0.05}


async def test_a_sequential_canary_stops_as_soon_as_the_evidence_decides(
    good: Simulator, poor: Simulator
) -> None:
    recovered = await Canary(CanaryParams(url=good.url, sprt=SPRT, requests=2), None).probe()
    assert recovered.ok, recovered.detail
    assert recovered.detail.startswith(
        "canary: recovered (acceptance back at 0.85, at most 0.01 of collapses"
    )
    assert "against bounds -4.55 / +2.99" in recovered.detail
    collapsed = await Canary(CanaryParams(url=poor.url, sprt=SPRT, requests=2), None).probe()
    assert not collapsed.ok
    assert collapsed.detail.startswith("canary: still collapsed (acceptance at 0.4")
    assert collapsed.acceptance is not None and collapsed.acceptance < 0.4


async def test_a_sequential_canary_that_cannot_decide_keeps_the_fallback() -> None:
    # Acceptance between the two levels, one short round: the evidence stays between the bounds.
    middling = await simulator([0.65, 0.65, 0.65])
    try:
        result = await Canary(
            CanaryParams(url=middling.url, sprt={**SPRT, "rounds": 1}, requests=1, max_tokens=4), None
        ).probe()
    finally:
        await middling.stop()
    assert not result.ok
    assert "undecided after 1 round(s)" in result.detail


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_acceptance": 0.5, "sprt": SPRT}, "give the canary one test"),
        ({}, "give the canary one test"),
        ({"sprt": {**SPRT, "shift_to": 0.9}}, "shift_to (0.9) must lie below in_control (0.85)"),
        ({"sprt": {**SPRT, "false_recovery": 0.6}}, "less than 0.5"),
        (
            {"sprt": {**SPRT, "spread": 0.4}},
            "spread 0.4 is not a standard deviation of acceptances around 0.85",
        ),
    ],
)
def test_a_canary_needs_exactly_one_sound_test(fields: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=re.escape(message)):
        CanaryParams.model_validate({"url": "http://127.0.0.1:8000", **fields})
