"""The running servers' facts: /version, /v1/models and the k their /metrics counts, read once per
run; a server that does not answer fails the items that compare with it, and its address is shown
without the credentials in it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.config.loading import load
from specguard.preflight.item import Context, Status
from specguard.preflight.items import baseline, speedup, tuning
from specguard.preflight.servers import servers
from specguard.store.connection import open_database
from tests.ports import free_port

PAGE = "\n".join(
    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="llama",position="{i}"}} {10 - i}.0'
    for i in range(3)
) + '\nvllm:spec_decode_num_drafts_total{engine="0",model_name="llama"} 12.0\n'  # fmt: skip


async def vllm(aiohttp_server: AiohttpServer) -> str:
    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "llama", "root": "/models/llama-70b"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://user:hunter2@127.0.0.1:{server.port}/metrics"


def context(tmp: Path, *targets: str, **extra: object) -> Context:
    (tmp / "specguard.yaml").write_text(json.dumps({
        "state_dir": str(tmp / "state"), "rules": [], "sources": {"scrape": {"targets": list(targets)}}, **extra,
    }))  # fmt: skip
    loaded = load(tmp / "specguard.yaml")
    assert loaded.ok, loaded.errors
    return Context(loaded=loaded, config_file=tmp / "specguard.yaml", store_file=tmp / "state" / "specguard.db",
                   now=1_800_000_000.0)  # fmt: skip


async def test_a_servers_facts_are_read_once(tmp_path: Path, aiohttp_server: AiohttpServer) -> None:
    target = await vllm(aiohttp_server)
    ctx = context(tmp_path, target)
    (found,) = await servers(ctx)
    assert (found.version, found.models, found.roots, found.k, found.errors) == (
        "0.32.0", ("llama",), ("/models/llama-70b",), 3, (),
    )  # fmt: skip
    assert found.base_url == target.replace("user:hunter2@", "").removesuffix("/metrics")
    assert found.labels() == {
        "instance": target.split("@")[1].removesuffix("/metrics"),
        "model_name": "llama",
    }
    assert await servers(ctx) is await servers(ctx)  # cached for the other items


async def test_a_server_that_does_not_answer_fails_the_items_that_compare_with_it(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    target = f"http://user:hunter2@127.0.0.1:{port}/metrics"
    (tmp_path / "baseline.json").write_text(json.dumps(
        {"version": 2, "measured_at": "2026-12-01T00:00:00Z", "entries": [{"model": "llama", "vllm_version": "0.32.0"}]}
    ))  # fmt: skip
    ctx = context(tmp_path, target, baseline=str(tmp_path / "baseline.json"))
    (found,) = await servers(ctx)
    assert found.version is None and found.k is None and len(found.errors) == 3
    assert all("hunter2" not in line for line in found.errors), found.errors
    answer = await baseline.check(ctx)
    assert answer.status is Status.FAIL
    assert answer.evidence[0] == f"http://127.0.0.1:{port}: model ?, vLLM ?, k unknown"
    assert answer.evidence[1].startswith(f"the server did not answer: http://127.0.0.1:{port}/version: ")
    assert (
        answer.fix
        == f"start the vLLM server at http://127.0.0.1:{port}, or correct the config's scrape targets"
    )

    (tmp_path / "state").mkdir()
    sqlite3.connect(tmp_path / "state" / "specguard.db").close()  # a database from before tune results
    answer = await tuning.check(ctx)
    assert answer.status is Status.FAIL
    assert answer.evidence[1].startswith("  its k could not be read: ")
    assert answer.fix is not None and answer.fix.startswith(
        f"start the vLLM server at http://127.0.0.1:{port}"
    )


async def test_no_speculation_anywhere_fails_the_speedup_saying_which_server_did_not_answer(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    ctx = context(tmp_path, f"http://127.0.0.1:{port}/metrics")
    open_database(tmp_path / "state" / "specguard.db").close()  # the daemon's, with no history yet
    answer = await speedup.check(ctx)
    assert answer.status is Status.FAIL
    assert answer.evidence == (
        f"http://127.0.0.1:{port}: model ?, vLLM ?, k unknown",
        "no configured server runs speculative decoding, and history holds no draft in the last 7d",
    )
    assert (
        answer.fix
        == f"start the vLLM server at http://127.0.0.1:{port}, or correct the config's scrape targets"
    )
