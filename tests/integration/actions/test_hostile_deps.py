"""The hostile dependency server (tests/hostile_deps.py) does what its modes say, counts what it
served, and answers every path correctly once healed."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.hostile_deps import HUGE, HostileDeps

SHORT = aiohttp.ClientTimeout(total=1.5)


@pytest.fixture(scope="module")
def server() -> Iterator[HostileDeps]:
    with HostileDeps(trickle=0.3) as running:
        yield running


@pytest.fixture(autouse=True)
def _reset(server: HostileDeps) -> None:
    server.modes.clear()
    server.harm()


async def _get(url: str, method: str = "GET", **kwargs: object) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(timeout=SHORT) as session,
        session.request(method, url, allow_redirects=False, **kwargs) as answer,  # type: ignore[arg-type]
    ):
        return answer.status, dict(answer.headers), await answer.read()


async def test_flag_api_stores_and_reads_back_and_counts(server: HostileDeps) -> None:
    status, _, _ = await _get(server.url("/flag/spec"))
    assert status == 404
    status, _, body = await _get(server.url("/flag/spec"), "PUT", json={"speculative": False})
    assert status == 200 and json.loads(body) == {"speculative": False}
    status, _, body = await _get(server.url("/flag/spec"))
    assert json.loads(body) == {"speculative": False}
    assert server.count("/flag/spec", "PUT") == 1
    assert server.served_count("/flag/spec", "PUT") == 1
    assert server.count("/flag/spec") == 3
    assert server.flag_writes[-1] == ("/flag/spec", {"speculative": False})


async def test_a_mode_set_at_run_time_or_named_in_the_url(server: HostileDeps) -> None:
    server.set("/flag", "hang")
    with pytest.raises(TimeoutError):
        await _get(server.url("/flag/x"), "PUT", json={})
    status, _, _ = await _get(server.url("/flag/x", "error500"), "PUT", json={})
    assert status == 500
    assert server.count("/flag/x", "PUT") == 2  # the mode's segment is not part of the path counted
    assert server.served_count("/flag/x") == 0
    server.heal()  # every path correct, whatever was set or named
    status, _, _ = await _get(server.url("/flag/x", "hang"), "PUT", json={"a": 1})
    assert status == 200 and server.served_count("/flag/x", "PUT") == 1


async def test_slowloris_trickles_endless_never_ends_huge_is_huge(server: HostileDeps) -> None:
    for mode in ("slowloris", "endless", "huge", "huge500"):
        got = 0
        status = 0
        with contextlib.suppress(TimeoutError):  # loopback may carry 800 MB within the timeout
            async with (
                aiohttp.ClientSession(timeout=SHORT) as session,
                session.get(server.url("/flag", mode)) as answer,
            ):
                status = answer.status
                if mode.startswith("huge"):
                    assert answer.content_length == HUGE
                async for chunk in answer.content.iter_any():
                    got += len(chunk)
        assert status == (500 if mode == "huge500" else 200)
        assert got > (1024 * 1024 if mode != "slowloris" else 0)
        if mode == "slowloris":
            assert got < 100


async def test_redirects(server: HostileDeps) -> None:
    status, headers, _ = await _get(server.url("/flag/r", "redirect_loop") + "?hop=3")
    assert status == 307 and headers["Location"] == "/redirect_loop/flag/r?hop=4"
    with pytest.raises(aiohttp.TooManyRedirects):
        async with (
            aiohttp.ClientSession(timeout=SHORT) as session,
            session.get(server.url("/flag/r", "redirect_loop"), max_redirects=5),
        ):
            pass
    server.set("/flag/c", "cross_host")
    status, headers, _ = await _get(server.url("/flag/c"), "PUT", json={})
    assert status == 307 and headers["Location"] == f"http://127.0.0.1:{server.elsewhere_port}/flag/c"
    async with (
        aiohttp.ClientSession(timeout=SHORT) as session,
        session.put(server.url("/flag/c"), json={}) as answer,
    ):
        assert answer.status == 200 and str(answer.url).startswith(
            f"http://127.0.0.1:{server.elsewhere_port}"
        )
    assert server.elsewhere["PUT /flag/c"] == 1


async def test_garbage_and_reset(server: HostileDeps) -> None:
    status, _, body = await _get(server.url("/slack/api/chat.postMessage", "garbage"), "POST")
    assert status == 200
    with pytest.raises(ValueError):
        json.loads(body)
    with pytest.raises(aiohttp.ClientPayloadError):
        await _get(server.url("/flag", "reset"))


@pytest.mark.parametrize("mode", ["retry_inf", "retry_huge", "retry_date", "retry_nan"])
async def test_retry_after(server: HostileDeps, mode: str) -> None:
    status, headers, body = await _get(server.url("/slack/api/chat.postMessage", mode), "POST")
    assert status == 429 and json.loads(body) == {"ok": False, "error": "ratelimited"}
    value = headers["Retry-After"]
    if mode == "retry_date":
        assert email.utils.parsedate_to_datetime(value).timestamp() > time.time() + 300 * 86400
    else:
        assert value == {"retry_inf": "inf", "retry_huge": "999999999", "retry_nan": "nan"}[mode]


async def test_slack_errors_and_a_healthy_slack(server: HostileDeps) -> None:
    for error in ("invalid_auth", "channel_not_found", "not_in_channel", "account_inactive"):
        _, _, body = await _get(server.url("/slack/api/chat.postMessage", error), "POST")
        assert json.loads(body) == {"ok": False, "error": error}
    _, _, body = await _get(server.url("/slack/api/chat.postMessage", "ok_without_ts"), "POST")
    assert json.loads(body) == {"ok": True}
    meta = {"event_type": "specguard_notice", "event_payload": {"notice": 7}}
    _, _, body = await _get(
        server.url("/slack/api/chat.postMessage"),
        "POST",
        data={"channel": "C0123456", "text": "hi", "metadata": json.dumps(meta)},
    )
    posted = json.loads(body)
    assert posted["ok"] and posted["channel"] == "C0123456" and posted["ts"]
    _, _, body = await _get(
        server.url("/slack/api/chat.update"),
        "POST",
        json={"channel": "C0123456", "ts": posted["ts"], "text": "edited"},
    )
    assert json.loads(body)["ok"]
    _, _, body = await _get(
        server.url("/slack/api/conversations.history") + "?channel=C0123456&include_all_metadata=true"
    )
    found = json.loads(body)["messages"]
    assert [(m["text"], m["metadata"]) for m in found] == [("edited", meta)]
    assert server.served_count("/slack/api/chat.postMessage", "POST") == 1


def _totals(page: bytes) -> dict[str, float]:
    return {
        s.name: s.value
        for f in text_string_to_metric_families(page.decode())
        for s in f.samples
        if s.name.endswith("_total")
    }


async def test_a_healthy_vllm_and_its_lies(server: HostileDeps) -> None:
    _, _, body = await _get(server.url("/vllm/v1/models"))
    assert json.loads(body)["data"][0]["id"]
    _, _, before = await _get(server.url("/vllm/metrics"))
    _, _, body = await _get(server.url("/vllm/v1/completions"), "POST", json={})
    assert json.loads(body)["usage"]["completion_tokens"] == 64
    _, _, after = await _get(server.url("/vllm/metrics"))
    a, b = _totals(after), _totals(before)
    accepted = (
        a["vllm:spec_decode_num_accepted_tokens_total"] - b["vllm:spec_decode_num_accepted_tokens_total"]
    )
    drafted = a["vllm:spec_decode_num_draft_tokens_total"] - b["vllm:spec_decode_num_draft_tokens_total"]
    assert accepted / drafted == pytest.approx(0.8)
    assert (await _get(server.url("/vllm/health")))[0] == 200
    assert json.loads((await _get(server.url("/vllm/version")))[2])["version"]

    _, _, body = await _get(server.url("/vllm/v1/completions", "canary_overflow"), "POST", json={})
    assert b"1e999" in body
    _, _, page = await _get(server.url("/vllm/metrics", "canary_nan"))
    assert all(v != v for v in _totals(page).values())  # NaN
    _, _, first = await _get(server.url("/vllm/metrics", "canary_backwards"))
    _, _, second = await _get(server.url("/vllm/metrics", "canary_backwards"))
    assert all(_totals(second)[k] < v for k, v in _totals(first).items() if v > 0)
    _, _, before = await _get(server.url("/vllm/metrics"))
    await _get(server.url("/vllm/v1/completions", "canary_absurd"), "POST", json={})
    _, _, after = await _get(server.url("/vllm/metrics"))
    a, b = _totals(after), _totals(before)
    accepted = (
        a["vllm:spec_decode_num_accepted_tokens_total"] - b["vllm:spec_decode_num_accepted_tokens_total"]
    )
    drafted = a["vllm:spec_decode_num_draft_tokens_total"] - b["vllm:spec_decode_num_draft_tokens_total"]
    assert accepted / drafted == pytest.approx(10_000)


async def test_hanging_requests_do_not_stop_the_server(server: HostileDeps) -> None:
    server.set("/vllm", "hang")
    hung = [
        asyncio.ensure_future(_get(server.url("/vllm/v1/completions"), "POST", json={})) for _ in range(5)
    ]
    await asyncio.sleep(0.2)
    server.heal()
    status, _, _ = await _get(server.url("/vllm/health"))
    assert status == 200
    for each in hung:
        with pytest.raises(TimeoutError):
            await each
