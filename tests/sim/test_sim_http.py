"""vLLM's HTTP surface: readiness, the small endpoints, and errors as vLLM reports them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from sim.options import SimOptions
from sim.server import start_simulator
from tests.sim.simclient import MODEL, metrics_text, running, value


async def test_the_port_refuses_connections_while_loading_then_health_is_200(
    session: aiohttp.ClientSession, unused_tcp_port: int
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
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
    finally:
        await sim.stop()
    assert refused >= 5  # about 0.5 s of refusals


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


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"prompt": "hi", "n": 2}', 400, "n must be 1"),
        (b'{"prompt": "hi", "temperature": -1}', 400, "temperature"),
        (b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"prompt": "hi", "max_tokens": 5000}', 400, "maximum context length is 1024"),
        (b'{"prompt": "hi", "stream_options": {"include_usage": true}}', 400, "stream=True"),
        (b'{"max_tokens": 3}', 400, "prompt"),
        (b'{"prompt": "hi", "model": "gpt-4"}', 404, "The model `gpt-4` does not exist."),
    ],
)
async def test_bad_requests_get_vllms_error_body(
    session: aiohttp.ClientSession, body: bytes, status: int, fragment: str
) -> None:
    async with running() as sim:
        headers = {"Content-Type": "application/json"}
        async with session.post(sim.url + "/v1/completions", data=body, headers=headers) as response:
            assert response.status == status
            error: dict[str, Any] = (await response.json())["error"]
    assert fragment in error["message"]
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert "Traceback" not in error["message"]


async def test_chat_needs_messages_and_unknown_routes_are_404(session: aiohttp.ClientSession) -> None:
    async with running() as sim:
        async with session.post(sim.url + "/v1/chat/completions", json={"messages": []}) as response:
            assert response.status == 400
            assert "messages" in (await response.json())["error"]["message"]
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
