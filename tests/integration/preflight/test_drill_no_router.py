"""The drill without specguard's router (no ``routing:`` section): the flag is a file that a router
of the operator's reads (here the demo's own, ``sim.flag_router``), and only the standard servers'
request counter (``preflight.drill.standard_metrics``) can show the traffic moving, so production
traffic must be flowing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from specguard.config.loading import load
from specguard.preflight.item import Context, Status
from specguard.preflight.items import drill
from specguard.sim.flag_router import FlagRouter
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from tests.ports import free_port
from tests.statedb import query


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[tuple[Simulator, Simulator]]:
    speculative = await start_simulator(
        SimOptions(port=free_port(), step_time=0.002, seed=3,
                   speculative=SpeculativeConfig("draft_model", "tiny-draft", 4), acceptance_by_position=[0.85])
    )  # fmt: skip
    try:
        standard = await start_simulator(SimOptions(port=free_port(), step_time=0.002, seed=4))
        try:
            yield speculative, standard
        finally:
            await standard.stop()
    finally:
        await speculative.stop()


async def traffic(router: FlagRouter) -> None:
    """Requests, one after another, each to the server the flag file names when it leaves."""
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 8, "temperature": 0}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while True:
            async with session.post(f"{router()}/v1/completions", json=body) as answer:
                await answer.read()
            await asyncio.sleep(0.02)


def write_config(directory: Path, speculative: Simulator, standard: Simulator, flag: Path) -> Path:
    action = {
        "type": "feature_flag",
        "file": {"path": str(flag), "engage": {"speculative": False}, "restore": {"speculative": True}},
        "canary": {"url": speculative.url, "min_acceptance": 0.5, "requests": 2, "max_tokens": 32},
    }
    config = directory / "specguard.yaml"
    (directory / "rules.yaml").write_text(
        'rules:\n  - name: low\n    signal: acceptance_rate\n    condition: "< 0.4"\n    actions: [fallback]\n'
    )
    config.write_text(
        "state_dir: state\nrules: [rules.yaml]\n"
        f"actions:\n  fallback: {json.dumps(action)}\n"
        f"preflight:\n  drill: {{standard_metrics: ['{standard.url}/metrics'], timeout: 3s}}\n"
    )
    return config


async def run(config: Path) -> tuple[Status, tuple[str, ...], dict[str, object]]:
    loaded = load(config)
    assert loaded.ok, loaded.problems
    answer = await drill.check(Context(loaded, config, None, time.time(), drill=True))
    rows = query(loaded.config.store_file(), "SELECT * FROM drills ORDER BY id")
    return answer.status, answer.evidence, rows[-1]


async def test_the_standard_servers_counter_shows_production_traffic_moving(tmp_path: Path) -> None:
    async with servers() as (speculative, standard):
        flag = tmp_path / "flags.json"
        flag.write_text('{"speculative": true}')
        router = FlagRouter(flag, speculative.url, standard.url, lambda *_: None)
        config = write_config(tmp_path, speculative, standard, flag)
        sending = asyncio.create_task(traffic(router))
        try:
            status, evidence, row = await run(config)
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
        assert status is Status.PASS, evidence
        assert row["outcome"] == "passed"
        moved = [line for line in evidence if line.startswith("the standard servers served +")]
        assert moved and moved[0].endswith("request(s) while engaged"), evidence
        assert json.loads(flag.read_text()) == {"speculative": True}


async def test_without_traffic_nothing_shows_it_moving_and_the_flag_is_restored(tmp_path: Path) -> None:
    async with servers() as (speculative, standard):
        flag = tmp_path / "flags.json"
        flag.write_text('{"speculative": true}')
        config = write_config(tmp_path, speculative, standard, flag)
        status, _, row = await run(config)
        assert status is Status.FAIL
        assert (row["outcome"], row["detail"]) == (
            "failed",
            "traffic did not move: the standard servers served +0 request(s) in 3s after the engage "
            "(is production traffic flowing?)",
        )
        assert json.loads(flag.read_text()) == {"speculative": True}
