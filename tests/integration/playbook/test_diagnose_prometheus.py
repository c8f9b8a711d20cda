"""`specguard diagnose --prometheus` against a real Prometheus scraping a simulated vLLM: the raw
series at the window's ends become the same increases history would hold, and the KV-cache usage
comes from Prometheus's own range functions. A collapsed acceptance under a full KV-cache comes out
with both causes and the simulator's numbers."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import aiohttp
import pytest

from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.scenario import Scenario, TimelineEvent
from specguard.sim.server import start_simulator
from specguard.sim.traffic import Traffic
from tests.processes import specguard
from tests.prometheus_server import running_prometheus

pytestmark = pytest.mark.real


async def scrapes_since(url: str, since: float) -> int:
    query = f"count_over_time(up[{max(1, math.ceil(time.time() - since))}s])"
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/api/v1/query", params={"query": query}) as answer,
    ):
        result = (await answer.json())["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


async def test_a_collapse_under_a_full_kv_cache_read_from_prometheus(
    tmp_path: Path, unused_tcp_port: int
) -> None:
    full = Scenario(timeline=[TimelineEvent(at=0.0, kv_usage=0.97)])
    sim = await start_simulator(
        SimOptions(port=0, speculative=SpeculativeConfig("eagle3", "head", 3), acceptance_by_position=[0.2],
                   step_time=0.01, seed=3, scenario=full)
    )  # fmt: skip
    try:
        async with running_prometheus(f"127.0.0.1:{sim.port}", tmp_path, unused_tcp_port) as prometheus:
            started = time.time()
            while await scrapes_since(prometheus.url, started) < 3:
                await asyncio.sleep(0.2)
            window_start = time.time()
            traffic = Traffic(sim.url, sim.options.model, concurrency=4, max_tokens=48)
            await traffic.start()
            await asyncio.sleep(8.0)
            await traffic.stop()
            await asyncio.sleep(2.5)  # Prometheus's last scrapes after the traffic
            since = f"{math.floor(time.time() - window_start)}s"
            (tmp_path / "specguard.yaml").write_text(f"state_dir: {tmp_path / 'state'}\n")
            code, out, err = await specguard(
                "diagnose", "--config", str(tmp_path / "specguard.yaml"), "--prometheus", prometheus.url,
                "--since", since, "--case", "1", "--json",
            )  # fmt: skip
    finally:
        await sim.stop()
    assert code in (1, 3), err
    result = json.loads(out)
    (case,) = result["cases"]
    assert result["window"]["source"] == "prometheus"
    assert result["window"]["servers"] == [[f"127.0.0.1:{sim.port}", sim.options.model]]
    figures = {f["name"]: f["value"] for f in case["figures"]}
    assert case["verdict"] == "cause found", case
    assert "acceptance collapsed" in case["summary"] and "KV-cache pressure" in case["summary"]
    assert figures["alpha_hat"] == pytest.approx(0.2, abs=0.05)
    assert figures["k"] == 3
    assert figures["kv_cache_usage_peak"] == pytest.approx(97.0)
    assert figures["kv_cache_usage_mean"] == pytest.approx(97.0)
    # the baseline is missing: the speedup cannot be told, and the output says why
    assert figures["estimated_speedup"] is None and any("no baseline" in m for m in case["missing"])
