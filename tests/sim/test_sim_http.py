"""vLLM's HTTP surface: readiness, the small endpoints, and errors as vLLM reports them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from specguard.sim.options import SimOptions
from specguard.sim.server import start_simulator
from tests.sim.simclient import (
    FIXTURES,
    MODEL,
    chat,
    completion,
    metrics_text,
    post,
    running,
    speculative,
    value,
)
from tests.vllm_http import PROBES, differences, observe_all


async def test_the_port_refuses_connections_while_loading_then_health_is_200(
    session: aiohttp.ClientSession, unused_tcp_port: int
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    begun = time.monotonic()
    starting = asyncio.create_task(start_simulator(SimOptions(port=unused_tcp_port, startup_delay=0.5)))
    refused = 0
    while not starting.done():
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(url + "/health")
        refused += 1
        await asyncio.sleep(0.05)
    sim = await starting
    try:
        async with session.get(url + "/health") as response:
            assert response.status == 200
            assert await response.read() == b""
        ready = time.monotonic()
    finally:
        await sim.stop()
    assert refused >= 1
    assert ready - begun >= 0.5  # refused for the whole "load", never served before it ended


async def test_version_models_and_port_zero(session: aiohttp.ClientSession) -> None:
    async with running(max_model_len=2048, kv_capacity_tokens=4096) as sim:
        assert sim.port > 0 and sim.url == f"http://127.0.0.1:{sim.port}"
        async with session.get(sim.url + "/version") as response:
            assert await response.json() == {"version": "0.32.0"}
        async with session.get(sim.url + "/v1/models") as response:
            models = await response.json()
    (card,) = models["data"]
    assert models["object"] == "list"
    assert {k: card[k] for k in ("id", "object", "owned_by", "root", "parent", "max_model_len")} == {
        "id": MODEL,
        "object": "model",
        "owned_by": "vllm",
        "root": MODEL,
        "parent": None,
        "max_model_len": 2048,
    }
    assert card["permission"][0]["object"] == "model_permission"


async def test_tokenize_counts_a_prompt_as_generation_charges_it_whatever_its_length(
    session: aiohttp.ClientSession,
) -> None:
    long_text = "word " * 2000  # far past the context: counting is how a client learns that
    async with running(max_model_len=1024) as sim:
        counted = await post(session, sim, "/tokenize", {"model": MODEL, "prompt": "Tell me a story."})
        as_chat = await post(
            session, sim, "/tokenize", {"messages": [{"role": "user", "content": "Tell me a story."}]}
        )
        long = await post(session, sim, "/tokenize", {"prompt": long_text})
        served = await completion(session, sim, prompt="Tell me a story.", max_tokens=2)
        chatted = await chat(
            session, sim, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=2
        )
        async with session.post(sim.url + "/tokenize", json={"model": "llama-70b", "prompt": "x"}) as answer:
            wrong_model = (answer.status, await answer.json())
        async with session.post(sim.url + "/tokenize", json={"model": MODEL}) as answer:
            nothing = (answer.status, await answer.json())
        async with session.post(
            sim.url + "/tokenize", data=b"{", headers={"Content-Type": "application/json"}
        ) as answer:
            not_json = answer.status
    assert set(counted) == {"count", "max_model_len", "tokens", "token_strs"}
    assert counted["max_model_len"] == 1024 and counted["count"] == len(counted["tokens"])
    assert counted["count"] == served["usage"]["prompt_tokens"]  # what a request is charged
    assert as_chat["count"] == chatted["usage"]["prompt_tokens"]  # the chat template included
    assert long["count"] == 2500 and long["max_model_len"] == 1024
    assert wrong_model[0] == 404 and "`llama-70b` does not exist" in wrong_model[1]["error"]["message"]
    assert nothing[0] == 400 and "Either prompt or messages" in nothing[1]["error"]["message"]
    assert not_json == 400


async def test_every_answer_has_the_status_headers_and_shape_a_real_vllm_gave() -> None:
    """The probes of tests/vllm_http.py against the simulator, compared with a real vLLM 0.32.0's
    answers to the same requests (status, content type, allow, server, vary; error bodies exactly)."""
    real = json.loads((FIXTURES / "vllm-0.32.0-http.json").read_text())
    options = {"speculative": speculative(4), "max_model_len": 1024, "kv_capacity_tokens": 4096}
    async with running(**options) as sim:
        ours = await observe_all(sim.url)
    assert differences(real, ours) == {}
    assert set(real) == {probe.name for probe in PROBES}  # the capture holds every probe


async def test_errors_are_counted_by_handler_as_the_instrumentator_does(
    session: aiohttp.ClientSession,
) -> None:
    async with running() as sim:
        async with session.post(sim.url + "/v1/chat/completions", json={"messages": []}) as response:
            assert response.status == 400
            assert "empty conversation" in (await response.json())["error"]["message"]
        async with session.get(sim.url + "/v2/nothing") as response:
            assert response.status == 404
            assert await response.json() == {"detail": "Not Found"}
        text = await metrics_text(session, sim)
    assert value(text, "http_requests_total", handler="/v1/chat/completions", status="4xx") == 1
    assert value(text, "http_requests_total", handler="none", status="4xx") == 1


async def test_ground_truth_is_served_as_json_and_appended_to_a_file(
    session: aiohttp.ClientSession, tmp_path: Any
) -> None:
    path = tmp_path / "truth.jsonl"
    async with running(ground_truth_file=path) as sim:
        async with session.post(
            sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}
        ) as response:
            request_id = (await response.json())["id"]
        async with session.get(sim.url + "/sim/ground-truth") as response:
            served = await response.json()
    assert [r["id"] for r in served] == [request_id]
    assert served[0]["completion_tokens"] == 4 and served[0]["steps"]
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and request_id in lines[0]
