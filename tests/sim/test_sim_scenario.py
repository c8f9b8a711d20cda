"""Scenario timelines change a running simulator on schedule, as specguard sees through /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp
import pytest

from daemon.yamlfile import FileProblems
from sim.scenario import load_scenario
from sim.server import Simulator
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


async def _until(loop_time: float) -> None:
    await asyncio.sleep(max(loop_time - asyncio.get_running_loop().time(), 0.0))


async def _keep_busy(session: aiohttp.ClientSession, sim: Simulator, workers: int) -> None:
    async def worker() -> None:
        while True:
            await chat(session, sim, max_tokens=24, ignore_eos=True, temperature=0)

    await asyncio.gather(*(worker() for _ in range(workers)))


async def test_acceptance_drops_after_the_timeline_says_so(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    scenario = load_scenario(_scenario(tmp_path, "timeline:\n  - at: 1s\n    acceptance: 0.1\n"))
    k, before, after = 3, 0.9, 0.1
    async with running(speculative=speculative(k), acceptance_by_position=[before], scenario=scenario) as sim:
        start, start_wall = asyncio.get_running_loop().time(), time.time()  # the scenario's clock
        busy = asyncio.create_task(_keep_busy(session, sim, workers=8))
        try:
            ahead = await measure(sim, _until(start + 0.9))  # scrapes at ~0.0 s and 0.9 s
            await _until(start + 1.1)
            behind = await measure(sim, _until(start + 2.0))  # scrapes at ~1.1 s and 2.0 s
        finally:
            busy.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await busy
        times = [s.time - start_wall for r in sim.ground_truth() for s in r.steps if s.draft_tokens]
    # Tolerances from the drafts in each window (counted from the ground truth, so approximately:
    # the windows' edges are the scrapes'), 4 standard deviations each as in test_sim_acceptance.
    drafts_ahead = sum(1 for t in times if t < 0.9)
    drafts_behind = sum(1 for t in times if 1.1 <= t <= 2.0)
    assert min(drafts_ahead, drafts_behind) > 300
    expected_ahead = expected_acceptance_rate(before, k)  # 0.81
    expected_behind = expected_acceptance_rate(after, k)  # 0.037
    assert abs(ahead.acceptance_rate - expected_ahead) < four_sigma_rate(before, k, drafts_ahead), ahead
    assert abs(behind.acceptance_rate - expected_behind) < four_sigma_rate(after, k, drafts_behind), behind


async def test_a_kv_usage_ramp_raises_the_reported_usage_linearly(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    path = _scenario(tmp_path, "timeline:\n  - at: 0.2s\n    kv_usage: {to: 0.9, over: 0.6s}\n")
    async with running(scenario=load_scenario(path)) as sim:
        start = asyncio.get_running_loop().time()
        idle = value(await metrics_text(session, sim), "vllm:kv_cache_usage_perc")
        await _until(start + 0.5)
        halfway = value(await metrics_text(session, sim), "vllm:kv_cache_usage_perc")
        await _until(start + 0.9)
        full = value(await metrics_text(session, sim), "vllm:kv_cache_usage_perc")
    assert idle == 0
    assert 0.3 < halfway < 0.6  # 0.45 at 0.5 s; the window allows for scheduling delay
    assert full == 0.9


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
