"""Scenario timelines change a running simulator on schedule, as specguard sees through /metrics."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from specguard.common.yamlfile import FileProblems
from specguard.sim.scenario import load_scenario
from specguard.sim.server import Simulator
from tests.sim.simclient import (
    chat,
    expected_acceptance_rate,
    four_sigma_rate,
    measure,
    metrics_text,
    running,
    speculative,
    value,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "sim" / "examples"


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


async def test_acceptance_drops_after_the_timeline_says_so(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Traffic before the change and traffic after it, each measured through /metrics. What is
    compared with what is decided by the times the simulator recorded, not by when the test hoped
    its requests would run: the scrapes measure exactly the drafts of their phase (ground truth), and
    the drafts before and after the recorded change follow the old and the new acceptance."""
    scenario = load_scenario(_scenario(tmp_path, "timeline:\n  - at: 2s\n    acceptance: 0.1\n"))
    k, before, after = 3, 0.9, 0.1
    async with running(speculative=speculative(k), acceptance_by_position=[before], scenario=scenario) as sim:
        ahead = await measure(sim, _requests(session, sim, 40))
        first = {r.id for r in sim.ground_truth()}
        while not sim.engine.acceptance_changes:  # the scenario applies its event on its own clock
            await asyncio.sleep(0.05)
        behind = await measure(sim, _requests(session, sim, 40))
        truth = sim.ground_truth()
    ((changed_at, values),) = sim.engine.acceptance_changes
    assert values == [after]
    phase_a = [r for r in truth if r.id in first]
    phase_b = [r for r in truth if r.id not in first]
    for measured, phase in ((ahead, phase_a), (behind, phase_b)):  # /metrics says exactly what happened
        counted = sum(r.accepted_tokens for r in phase) / sum(r.draft_tokens for r in phase)
        assert measured.acceptance_rate == pytest.approx(counted, rel=1e-12)
    drafts = [s for r in truth for s in r.steps if s.draft_tokens]
    early = [s for s in drafts if s.time < changed_at]
    late = [s for s in drafts if s.time >= changed_at]
    assert len(late) >= 300 and min(s.time for s in late) >= changed_at
    for steps, alpha in ((early, before), (late, after)):
        rate = sum(s.accepted for s in steps) / sum(s.draft_tokens for s in steps)
        assert abs(rate - expected_acceptance_rate(alpha, k)) < four_sigma_rate(alpha, k, len(steps)), (
            alpha,
            rate,
        )


async def _requests(session: aiohttp.ClientSession, sim: Simulator, count: int) -> None:
    await asyncio.gather(
        *(chat(session, sim, max_tokens=24, ignore_eos=True, temperature=0) for _ in range(count))
    )


async def test_a_kv_usage_ramp_raises_the_reported_usage_linearly(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Every reading lies on the line from 0 to 0.9 between the times it was asked and answered."""
    path = _scenario(tmp_path, "timeline:\n  - at: 0s\n    kv_usage: {to: 0.9, over: 1s}\n")
    async with running(scenario=load_scenario(path)) as sim:
        readings = []
        while not readings or readings[-1][2] < 0.9:
            asked = time.monotonic()
            usage = value(await metrics_text(session, sim), "vllm:kv_cache_usage_perc")
            readings.append((asked, time.monotonic(), usage))
            await asyncio.sleep(0.02)
        ramp = sim.engine.kv_usage_floor_ramp
    assert ramp is not None and (ramp.start_value, ramp.end_value) == (0.0, 0.9)
    assert ramp.end - ramp.start == pytest.approx(1.0, abs=1e-9)
    for asked, answered, usage in readings:
        assert ramp.at(asked) - 1e-9 <= usage <= ramp.at(answered) + 1e-9, (asked, answered, usage)
    assert any(0 < usage < 0.9 for _, _, usage in readings)  # it climbs, it does not jump


async def test_die_closes_the_port_and_cuts_streams(session: aiohttp.ClientSession, tmp_path: Path) -> None:
    path = _scenario(tmp_path, "timeline:\n  - at: 0.3s\n    die: true\n")
    async with running(scenario=load_scenario(path), step_time=0.01) as sim:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": 1000,
            "ignore_eos": True,
        }
        async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):  # cut, not finished
                await response.read()
        await asyncio.wait_for(sim.wait_closed(), timeout=5)
        assert sim.died
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(sim.url + "/health")


def test_scenario_errors_name_the_file_line_and_field(tmp_path: Path) -> None:
    path = _scenario(
        tmp_path,
        "timeline:\n  - at: 10s\n    acceptance: 0.5\n  - at: soon\n    acceptance: 1.5\n    colour: red\n",
    )
    with pytest.raises(FileProblems) as caught:
        load_scenario(path)
    messages = [str(problem) for problem in caught.value.problems]
    assert any(m.startswith(f"{path}:4: timeline[1].at: invalid duration") for m in messages), messages
    assert any(m.startswith(f"{path}:5: timeline[1].acceptance:") for m in messages), messages
    assert any(m == f"{path}:6: timeline[1].colour: unknown key" for m in messages), messages


def test_an_event_that_changes_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileProblems, match="an event changes something"):
        load_scenario(_scenario(tmp_path, "timeline:\n  - at: 1s\n"))


def test_the_shipped_example_scenarios_load() -> None:
    examples = sorted(EXAMPLES.glob("scenario-*.yaml"))
    assert examples
    for path in examples:
        assert load_scenario(path).timeline


def test_an_engine_is_a_non_negative_index_and_die_takes_none(tmp_path: Path) -> None:
    with pytest.raises(FileProblems) as caught:
        load_scenario(_scenario(tmp_path, "timeline:\n  - at: 1s\n    engine: -1\n    acceptance: 0.5\n"))
    assert any(":3: timeline[0].engine:" in str(problem) for problem in caught.value.problems)
    with pytest.raises(FileProblems, match="`die` stops the whole server: it takes no `engine`"):
        load_scenario(_scenario(tmp_path, "timeline:\n  - at: 1s\n    engine: 0\n    die: true\n"))
