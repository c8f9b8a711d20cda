"""--data-parallel-size N: N engines behind one API server, each with its own `engine` label, scheduler
and KV cache, and requests routed to the least loaded, as vLLM 0.32's internal load balancer does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.sim.engine.router import Router
from specguard.sim.options import OptionsError, SimOptions
from specguard.sim.scenario import load_scenario
from tests.sim.simclient import completion, families, metrics_text, running, speculative, value

PER_ENGINE = (
    "vllm:spec_decode_num_drafts",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
    "vllm:engine_sleep_state",
)


async def test_every_per_engine_series_exists_once_per_engine_and_http_metrics_once(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(2), data_parallel_size=3) as sim:
        await completion(session, sim, max_tokens=4)
        ours = families(await metrics_text(session, sim))
    for name in PER_ENGINE:
        assert {s.labels["engine"] for s in ours[name].samples} == {"0", "1", "2"}, name
    assert all("engine" not in s.labels for s in ours["http_requests"].samples)
    assert all("engine" not in s.labels for s in ours["vllm:admission_rejections"].samples)


async def test_requests_spread_over_the_engines_and_each_counts_only_its_own(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(3), data_parallel_size=2, acceptance_by_position=[0.6]) as sim:
        results = await asyncio.gather(
            *(completion(session, sim, max_tokens=20, ignore_eos=True) for _ in range(10))
        )
        text = await metrics_text(session, sim)
        truth = sim.ground_truth()

    assert {record.id for record in truth} == {result["id"] for result in results}
    served_by = {engine: [r for r in truth if r.engine == engine] for engine in (0, 1)}
    # Ties rotate and in-flight requests weigh: neither engine is left idle.
    assert min(len(records) for records in served_by.values()) >= 3, served_by
    for engine, records in served_by.items():
        labels = {"engine": str(engine)}
        drafts = sum(r.drafts for r in records)
        accepted = sum(r.accepted_tokens for r in records)
        assert value(text, "vllm:spec_decode_num_drafts_total", **labels) == drafts
        assert value(text, "vllm:spec_decode_num_accepted_tokens_total", **labels) == accepted
        assert value(text, "vllm:generation_tokens_total", **labels) == 20 * len(records)
        assert value(text, "vllm:request_success_total", finished_reason="length", **labels) == len(records)


async def test_each_engine_has_its_own_kv_cache_and_scenario_events_can_name_one(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text("timeline:\n  - at: 0s\n    engine: 1\n    kv_usage: 0.99\n")
    async with running(data_parallel_size=2, scenario=load_scenario(path)) as sim:
        text = ""
        for _ in range(1000):  # the scenario task applies its first event once the loop runs it
            text = await metrics_text(session, sim)
            if value(text, "vllm:kv_cache_usage_perc", engine="1") > 0:
                break
            await asyncio.sleep(0.01)
    assert value(text, "vllm:kv_cache_usage_perc", engine="0") == 0.0
    assert value(text, "vllm:kv_cache_usage_perc", engine="1") == 0.99


def test_a_scenario_naming_an_engine_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text("timeline:\n  - at: 5s\n    engine: 2\n    acceptance: 0.1\n")
    with pytest.raises(OptionsError, match=r"engine 2, but there are 2 engine\(s\) \(0-1\)"):
        SimOptions(data_parallel_size=2, scenario=load_scenario(path))


class _FakeEngine:
    def __init__(self, waiting: int = 0, running: int = 0, unfinished: int = 0, kv: float = 0.0) -> None:
        self.num_waiting, self.num_running, self.num_unfinished, self._kv = waiting, running, unfinished, kv

    def kv_usage(self) -> float:
        return self._kv


def _pick(router: Router, engines: list[Any]) -> int:
    return engines.index(router.pick())


def test_the_router_takes_the_least_loaded_engine_and_rotates_on_ties() -> None:
    engines: list[Any] = [_FakeEngine(), _FakeEngine(), _FakeEngine()]
    router = Router(engines)
    assert [_pick(router, engines) for _ in range(4)] == [0, 1, 2, 0]  # idle: round robin

    busy: list[Any] = [_FakeEngine(running=3, unfinished=3), _FakeEngine(running=1, unfinished=2)]
    assert _pick(Router(busy), busy) == 1  # in-flight counts even before the engine admits it


def test_a_queue_on_a_full_kv_cache_weighs_more_than_the_same_queue_on_an_empty_one() -> None:
    # Both have 2 running and 2 waiting; engine 0's cache is full: 2 * 6 * (1.0 - 0.5) = +6.
    engines: list[Any] = [
        _FakeEngine(waiting=2, running=2, unfinished=4, kv=1.0),
        _FakeEngine(waiting=2, running=2, unfinished=4, kv=0.3),
    ]
    router = Router(engines)
    assert [_pick(router, engines) for _ in range(3)] == [1, 1, 1]
