"""`specguard bench` through a router that labels each answer with X-Specguard-Class and
X-Specguard-Pool, as specguard's nginx router does: a tiny aiohttp router on loopback that
classifies on the body (temperature, max_tokens) and forwards to a speculative or a standard
simulator. bench groups each request under the class the router named, with its pool, and gives
the acceptance of a class only when a phase was its alone."""

from __future__ import annotations

import json
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specguard.playbook.bench.load import Load
from specguard.playbook.bench.prompts import Prompt, load_file
from specguard.playbook.bench.routing import SHARED
from specguard.playbook.bench.runner import Options, bench
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from tests.processes import specguard


def classify(body: dict[str, Any]) -> tuple[str, str]:
    """The routing contract's example classes: first match wins."""
    if float(body.get("temperature", 1.0)) > 1.0:
        return "high_temperature", "standard"
    if int(body.get("max_tokens", 16)) < 32:
        return "short", "standard"
    return "default", "speculative"


@dataclass
class Router:
    url: str
    runner: web.AppRunner
    seen: dict[str, int]  # requests forwarded per class


async def start_router(pools: dict[str, str]) -> Router:
    seen: dict[str, int] = {}
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        data = await request.read()
        if request.path in ("/v1/completions", "/v1/chat/completions"):
            klass, pool = classify(json.loads(data))
        else:
            klass, pool = "other", "speculative"  # not inspected: the default pool
        seen[klass] = seen.get(klass, 0) + 1
        async with session.request(request.method, pools[pool] + request.path_qs, data=data,
                                   headers={"Content-Type": request.content_type}) as upstream:  # fmt: skip
            answer = web.StreamResponse(status=upstream.status)
            answer.content_type = upstream.content_type
            answer.headers["X-Specguard-Class"], answer.headers["X-Specguard-Pool"] = klass, pool
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_cleanup.append(lambda _: session.close())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return Router(f"http://127.0.0.1:{port}", runner, seen)


@dataclass
class Pools:
    router: Router
    speculative: Simulator
    standard: Simulator


@pytest.fixture
async def pools() -> AsyncIterator[Pools]:
    spec = await start_simulator(
        SimOptions(port=0, speculative=SpeculativeConfig("draft_model", "tiny-draft", 3),
                   acceptance_by_position=[0.8], step_time=0.02, draft_cost=0.1, seed=5)
    )  # fmt: skip
    plain = await start_simulator(SimOptions(port=0, step_time=0.02, seed=6))
    router = await start_router({"speculative": spec.url, "standard": plain.url})
    yield Pools(router, spec, plain)
    await router.runner.cleanup()
    await spec.stop()
    await plain.stop()


async def truth(url: str) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url + "/sim/ground-truth") as answer:
        return {r["id"]: r for r in await answer.json()}


# Three request shapes, each in a prompt class of its own: 4 long greedy ones (default ->
# speculative), 4 short ones (short -> standard), 4 hot ones (high_temperature -> standard).
SHAPES = [
    *(Prompt("long", f"Tell me about the number {i}.", 40) for i in range(4)),
    *(Prompt("brief", f"Name the number {i}.", 8) for i in range(4)),
    *(Prompt("hot", f"Invent a word for {i}.", 40, 1.5) for i in range(4)),
]
EXPECTED = {
    "default": ("speculative", "long"),
    "short": ("standard", "brief"),
    "high_temperature": ("standard", "hot"),
}


def options(pools: Pools, per_class: bool = True) -> Options:
    return Options(url=pools.router.url, prompts=SHAPES, load=Load(concurrency=2, warmup=0, seed=3),
                   per_class=per_class, metrics_url=pools.speculative.url)  # fmt: skip


async def test_each_request_is_grouped_under_the_class_and_pool_the_router_named(pools: Pools) -> None:
    report = await bench(options(pools))

    routing = report["routing"]["classes"]
    assert set(routing) == set(EXPECTED)
    spec, plain = await truth(pools.speculative.url), await truth(pools.standard.url)
    for name, (pool, phase) in EXPECTED.items():
        entry = routing[name]
        assert (entry["requests"], entry["completed"]) == (4, 4), name
        assert (entry["pool"], entry["phases"]) == (pool, [phase]), name
        results = report["phases"][phase]["results"]
        assert {(r.route_class, r.route_pool) for r in results} == {(name, pool)}
        # the pool's server answered every one of them (its ground truth holds their ids)
        records = spec if pool == "speculative" else plain
        assert all(r.response_id in records for r in results), name
        true_tpot = [
            (records[r.response_id]["finished_time"] - records[r.response_id]["first_token_time"])
            / (records[r.response_id]["completion_tokens"] - 1)
            for r in results
        ]
        # the client's TPOT of the class against the server's own times (a loaded machine's slack)
        assert entry["tpot"]["p50"] == pytest.approx(statistics.median(true_tpot), rel=0.1, abs=0.01), name
        assert (
            entry["output_tokens"]
            == sum(r.output_tokens for r in results)
            == 4 * (40 if phase != "brief" else 8)
        )
    assert pools.router.seen["default"] == 4 and pools.router.seen["short"] == 4

    # A phase per class: the speculative server's counters over the `long` phase are the default
    # class's; the standard-pool classes made no draft on it.
    default = routing["default"]
    assert default["acceptance_phase"] == "long"
    drafted = [s for r in report["phases"]["long"]["results"] for s in spec[r.response_id]["steps"]]
    assert default["acceptance"]["accepted_tokens"] == sum(s["accepted"] for s in drafted)
    assert default["acceptance"]["draft_tokens"] == sum(s["draft_tokens"] for s in drafted)
    assert routing["short"]["acceptance"] == {"error": "no drafts during the run", "drafts": 0}


async def test_classes_sharing_a_phase_get_their_pool_and_no_acceptance(pools: Pools) -> None:
    report = await bench(options(pools, per_class=False))

    (phase,) = report["phases"]
    routing = report["routing"]["classes"]
    assert {name: (e["requests"], e["pool"]) for name, e in routing.items()} == {
        name: (4, pool) for name, (pool, _) in EXPECTED.items()
    }
    for entry in routing.values():
        assert entry["acceptance"] is None and entry["acceptance_note"] == SHARED
        assert entry["phases"] == [phase]
    # the phase's acceptance stays, server-wide, as without a router
    assert report["phases"][phase]["acceptance"]["rate"] > 0


async def test_without_the_router_there_is_no_routing_section(pools: Pools) -> None:
    report = await bench(
        Options(url=pools.speculative.url, prompts=SHAPES[:4], load=Load(concurrency=2, warmup=0))
    )
    assert "routing" not in report


async def test_the_command_takes_a_mix_file_and_prints_the_table(pools: Pools, tmp_path: Path) -> None:
    mix = tmp_path / "mix.jsonl"
    lines = [
        {"class": p.klass, "prompt": p.text, "max_tokens": p.max_tokens}
        | ({"temperature": p.temperature} if p.temperature is not None else {})
        for p in SHAPES
    ]
    mix.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_file(mix) == SHAPES
    code, out, err = await specguard("bench", "--url", pools.router.url, "--prompts", str(mix), "--warmup", "0",
                                     "--metrics-url", pools.speculative.url)  # fmt: skip
    assert code == 0, err
    table = out.split("by routing class", 1)[1].splitlines()
    assert table[1].split()[:4] == ["ROUTING", "CLASS", "POOL", "OK/REQ"]
    rows = {line.split()[0]: line.split() for line in table[2:5]}
    assert rows["default"][1:4] == ["speculative", "4/4", "long"]
    assert rows["short"][1:4] == ["standard", "4/4", "brief"]
    assert rows["high_temperature"][1:4] == ["standard", "4/4", "hot"]
    assert rows["default"][7] != "-"  # its own phase: its acceptance
    code, out, err = await specguard("bench", "--url", pools.router.url, "--prompts", str(mix), "--warmup", "0",
                                     "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["routing"]["classes"]["short"]["pool"] == "standard"


async def test_a_bad_temperature_in_the_prompt_file_is_refused_with_its_line(tmp_path: Path) -> None:
    mix = tmp_path / "mix.jsonl"
    mix.write_text('{"prompt": "a"}\n{"prompt": "b", "temperature": "hot"}\n')
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--prompts", str(mix))
    assert code == 2
    assert err.strip().splitlines() == [
        f'specguard bench: {mix}:2: temperature: must be a number from 0 to 100, got "hot"'
    ]
