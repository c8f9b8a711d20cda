"""diagnose case 2 on a collapse of one traffic class only, behind the real nginx router.

Simulated vLLMs whose acceptance falls with the request's temperature (a · e^(−decay·T): 0.8 at
T = 0, 0.04 at T = 1.5, per draft position) serve the pools; the router sends requests of
temperature 0.9 or more to class ``creative``. So the class collapses because of what its requests
ask for, as on a real server, not because its server was set up to.

1. Two speculative pools (``chat`` for the default class, ``creative`` for the hot one) and a standard
   one: the router's and the servers' /metrics are scraped before and after the traffic into a real
   store's history, read back as diagnose reads it. Case 2 names class ``creative`` with the
   acceptance the servers' own ground truth gives, and the rule it prints, pasted into the routing
   section and rendered into the running nginx, sends the next hot request to the standard pool.
2. One speculative pool for both classes, measured with ``specguard bench --json`` through the router
   (one prompt class per request shape, so each routing class has a phase of its own): case 2 names
   class ``creative`` from bench's per-class figures; the router alone could not (one pool, one
   figure), and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from specguard.cli.entry import main
from specguard.config.routing import RoutingConfig
from specguard.playbook.diagnose.classes import judge
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Finding, Verdict
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.store import history
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from tests.nginx_router import Router, require_nginx
from tests.ports import free_port

MODEL = "tiny-llama"
K = 3
ACCEPTANCE, DECAY = 0.8, 2.0  # per position at T = 0; at T = 1.5: 0.8 e^-3 = 0.04
HOT, COOL = 1.5, 0.0
REQUESTS = 24  # per class: about 500 drafts at T = 0 (64 tokens, ~2.95 per draft), ~1500 hot
CLASSES = [
    {"name": "creative", "pool": "creative", "when": {"temperature": {"ge": 0.9}}},
    {"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}},
]


@pytest.fixture(autouse=True)
def _nginx() -> None:
    require_nginx()


def speculative(seed: int) -> SimOptions:
    return SimOptions(port=free_port(), model=MODEL, step_time=0.002, seed=seed,
                      speculative=SpeculativeConfig("draft_model", "tiny-draft", K),
                      acceptance_by_position=[ACCEPTANCE], temperature_decay=DECAY)  # fmt: skip


def address(sim: Simulator) -> str:
    return f"127.0.0.1:{sim.options.port}"


@dataclass
class Stack:
    sims: dict[str, Simulator]  # pool -> its one server
    router: Router
    section: dict[str, Any]  # the routing section, as the config gives it


@contextlib.asynccontextmanager
async def stack(
    directory: Path, pools: dict[str, SimOptions], classes: list[dict[str, Any]]
) -> AsyncIterator[Stack]:
    sims: dict[str, Simulator] = {}
    try:
        for name, options in pools.items():
            sims[name] = await start_simulator(options)
        section = {
            "listen": f"127.0.0.1:{free_port()}",
            "admin_listen": f"127.0.0.1:{free_port()}",
            "flag_file": str(directory / "routing-flag.json"),
            "pools": {name: {"servers": [address(sim)]} for name, sim in sims.items()},
            "default_pool": next(iter(pools)),
            "fallback_pool": "standard",
            "classes": classes,
        }
        router = Router(directory / "nginx", section)
        await asyncio.to_thread(router.start)
        try:
            yield Stack(sims, router, section)
        finally:
            await asyncio.to_thread(router.stop)
    finally:
        for sim in sims.values():
            await sim.stop()


async def send(
    session: aiohttp.ClientSession, router: Router, temperature: float, max_tokens: int = 64
) -> str:
    """One completion through the router; the pool it went to."""
    body = {
        "model": MODEL,
        "prompt": "write about the sea",
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    async with session.post(f"{router.url}/v1/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()
        return answer.headers["X-Specguard-Pool"]


async def scrape(session: aiohttp.ClientSession, targets: dict[str, str]) -> list[tuple[str, float, Any]]:
    """Each target's /metrics now, as the scrape source gives history: (instance, time, snapshot)."""
    out = []
    for instance, url in targets.items():
        async with session.get(url) as answer:
            out.append((instance, time.time(), parse_exposition(await answer.text())))
    return out


def ground_truth_rate(sim: Simulator, before: set[str]) -> float:
    """Accepted / draft tokens of the requests the server finished, those in ``before`` left out."""
    records = [r for r in sim.ground_truth() if r.id not in before]
    return sum(r.accepted_tokens for r in records) / sum(r.draft_tokens for r in records)


def by_scope(found: Finding, name: str) -> dict[str, Any]:
    return {f.scope: f.value for f in found.figures if f.name == name}


async def test_one_class_collapsing_on_its_own_pool_is_found_and_the_printed_rule_reroutes_it(
    tmp_path: Path,
) -> None:
    pools = {"chat": speculative(11), "creative": speculative(12), "standard": SimOptions(port=free_port(), model=MODEL, step_time=0.002, seed=13)}  # fmt: skip
    async with stack(tmp_path, pools, CLASSES) as world, aiohttp.ClientSession() as session:
        admin = world.router.config.admin_listen
        targets = {address(sim): f"http://{address(sim)}/metrics" for sim in world.sims.values()}
        targets[admin] = f"{world.router.admin_url}/specguard/metrics"
        # A series the router has not counted yet has no increase at its first count (history counts
        # increases, as Prometheus does): the router has served each class before the window opens.
        await asyncio.gather(send(session, world.router, COOL), send(session, world.router, HOT),
                             send(session, world.router, COOL, 16))  # fmt: skip
        scrapes = await scrape(session, targets)
        before = {r.id for sim in world.sims.values() for r in sim.ground_truth()}
        started = time.time()
        sent = await asyncio.gather(*(send(session, world.router, t) for t in [COOL, HOT] * REQUESTS),
                                    *(send(session, world.router, COOL, 16) for _ in range(4)))  # fmt: skip
        assert sorted(set(sent)) == ["chat", "creative", "standard"]
        scrapes += await scrape(session, targets)

        store = Store(tmp_path / "state" / "specguard.db")
        await store.open()
        try:
            await store.call(lambda db: history.record(db, scrapes))
            read = await store.call(lambda db: history.read(db, started - 120, time.time() + 120))
        finally:
            await store.close()
        routing = RoutingConfig.model_validate(world.section)
        evidence = Evidence("history", started - 120, time.time() + 120,
                            servers={key: spans for key, spans in read.items() if key[0] != admin},
                            routes={admin: read[(admin, "")]}, routing=routing)  # fmt: skip
        found = await judge(evidence)

        assert found.verdict is Verdict.CAUSE_FOUND, found
        assert found.summary.startswith("collapses on class creative (pool creative) (router)")
        rates = by_scope(found, "acceptance_rate")
        truth = {
            "chat": ground_truth_rate(world.sims["chat"], before),
            "creative": ground_truth_rate(world.sims["creative"], before),
        }
        assert rates["class default (pool chat)"] == pytest.approx(truth["chat"], rel=1e-9)
        assert rates["class creative (pool creative)"] == pytest.approx(truth["creative"], rel=1e-9)
        assert truth["chat"] > 0.5 and truth["creative"] < 0.1  # what the temperatures made of them
        table = {tuple(row["classes"]): row for row in found.details["sources"]["router"]}  # type: ignore[index]
        assert table[("creative",)]["requests"] == REQUESTS
        assert table[("default",)]["requests"] == REQUESTS

        # The rule, pasted into the routing section, rendered and reloaded into the running nginx.
        rule = yaml.safe_load(str(found.details["routing_rule"]))["routing"]
        world.router.config = RoutingConfig.model_validate({**world.section, **rule})
        await asyncio.to_thread(world.router.render)
        await asyncio.to_thread(world.router.reload)
        # New connections: the session's kept-alive one belongs to a worker of the old configuration,
        # which closes it as it shuts down (a request written to it then fails).
        async with aiohttp.ClientSession() as fresh:
            assert await send(fresh, world.router, HOT) == "standard"
            assert await send(fresh, world.router, COOL) == "chat"


def bench_json(url: str, metrics_url: str, prompts: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "--url", url, "--metrics-url", metrics_url, "--prompts", str(prompts),
                     "--concurrency", "4", "--warmup", "0", "--json"])  # fmt: skip
    assert code == 0, out.getvalue()[-2000:]
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


async def test_bench_through_the_router_names_the_class_one_shared_pool_hides(tmp_path: Path) -> None:
    pools = {"speculative": speculative(21), "standard": SimOptions(port=free_port(), model=MODEL, step_time=0.002, seed=22)}  # fmt: skip
    classes = [{"name": "creative", "pool": "speculative", "when": {"temperature": {"ge": 0.9}}}]
    prompts = tmp_path / "shapes.jsonl"
    lines = [{"class": name, "prompt": f"tell me about boat number {i}", "max_tokens": 64, "temperature": t}
             for name, t in (("cool", COOL), ("hot", HOT)) for i in range(REQUESTS)]  # fmt: skip
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    async with stack(tmp_path, pools, classes) as world:
        spec = world.sims["speculative"]
        result = await asyncio.to_thread(bench_json, world.router.url, f"http://{address(spec)}", prompts)
        routing = RoutingConfig.model_validate(world.section)
        now = time.time()
        found = await judge(Evidence("history", now - 600, now, routing=routing, bench=result))

    assert found.verdict is Verdict.CAUSE_FOUND, found
    assert found.summary.startswith("collapses on class creative (pool speculative) (bench)")
    measured = result["routing"]["classes"]
    rates = by_scope(found, "acceptance_rate")
    assert rates["class creative (pool speculative)"] == measured["creative"]["acceptance"]["rate"]
    assert rates["class default (pool speculative)"] == measured["default"]["acceptance"]["rate"]
    assert measured["creative"]["acceptance"]["rate"] < 0.1 < 0.5 < measured["default"]["acceptance"]["rate"]
    after = RoutingConfig.model_validate(
        {**world.section, **yaml.safe_load(str(found.details["routing_rule"]))["routing"]}
    )
    assert [(c.name, c.pool) for c in after.classes] == [("creative", "standard")]
    # The router's history would not have told them apart: one pool, one acceptance.
    assert any("router: no router series" in note for note in found.details["notes"])  # type: ignore[attr-defined]
