"""The restore's canary against a vLLM on loopback that answers what cannot be so: completions
whose token counts are not counts, counters that run backwards or grow impossibly, bodies that are
not JSON or are 800 MB, redirects. Each fails the canary with its reason, no traceback, and the
restore is tried again on its backoff: once the server answers sanely the flag is restored."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer

from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.feature_flag.canary import Canary, CanaryParams
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from tests.flag_servers import FakeVllm, HugeAnswer, PeakMemory, metrics_page

ENGAGED, RESTORED = {"speculative": False}, {"speculative": True}


async def start(aiohttp_server: AiohttpServer, vllm: FakeVllm, **extra: Any) -> str:
    server = await aiohttp_server(vllm.app(**extra), host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


def flag_action(tmp_path: Path, url: str, **canary: Any) -> FeatureFlagAction:
    raw = {
        "type": "feature_flag",
        "file": {"path": str(tmp_path / "flags.json"), "engage": ENGAGED, "restore": RESTORED},
        "canary": {"url": url, "min_acceptance": 0.6, "requests": 4, **canary},
        "restore_backoff": "1m",
    }
    return FeatureFlagAction("fallback", FeatureFlagParams.model_validate(raw))


async def restore_refused(action: FeatureFlagAction, store: Store, tmp_path: Path) -> str:
    """Engage, try to restore: refused by the canary, tried again after restore_backoff, the
    flag still engaged. The canary's reason."""
    memory = StoreMemory(store, "fallback")
    assert (await action.engage(memory)).ok
    failures = (await store.memory_read("fallback", "flag"))["canary_failures"]
    outcome = await action.restore_flag(memory)
    wait, said = (60.0, "1m") if failures == 0 else (120.0, "2m")  # doubled on the next failure
    assert not outcome.ok and outcome.retry_after == wait, outcome
    assert outcome.detail.endswith(f"; the fallback stays engaged, next try in {said}"), outcome.detail
    assert json.loads((tmp_path / "flags.json").read_text()) == ENGAGED
    assert (await store.memory_read("fallback", "flag"))["state"] == "engaged"
    return outcome.detail.removesuffix(f"; the fallback stays engaged, next try in {said}")


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"usage": {"completion_tokens": 1e999}}', "not JSON: 1e999 is not a finite number"),
        (b'{"usage": {"completion_tokens": NaN}}', "not JSON: NaN is not a number an answer can mean"),
        (b'{"usage": {"completion_tokens": -3}}', "says it generated -3 tokens: not a whole number from 0"),
        (b'{"usage": {"completion_tokens": 2.5}}', "says it generated 2.5 tokens"),
        (b'{"usage": {"completion_tokens": "12"}}', 'says it generated "12" tokens'),
        (b'{"usage": {"completion_tokens": true}}', "says it generated true tokens"),
        (b'{"usage": {"completion_tokens": 99999999999999999999}}', "to max_tokens 64"),
        (b'{"usage": 5}', "answered usage 5, not an object"),
        (b"[1, 2]", "answered list, not a completion"),
        (b'{"usage": {"completion_tokens": 1', "with a body that is not JSON: Expecting"),
        (b"<html>busy</html>", "with a body that is not JSON"),
    ],
)
async def test_a_malformed_completion_fails_the_canary_and_the_restore_is_tried_again(
    body: bytes,
    reason: str,
    aiohttp_server: AiohttpServer,
    store: Store,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    vllm = FakeVllm()
    vllm.completion = body
    url = await start(aiohttp_server, vllm)
    action = flag_action(tmp_path, url)
    said = await restore_refused(action, store, tmp_path)
    assert said.startswith(f"canary: POST {url}/v1/completions "), said
    assert reason in said, said
    no_traceback(caplog)
    vllm.completion = None  # the server answers sanely again: the next try restores
    done = await action.restore_flag(StoreMemory(store, "fallback"))
    assert done.ok and "canary: acceptance 0.80 over" in done.detail, done.detail
    assert json.loads((tmp_path / "flags.json").read_text()) == RESTORED


@pytest.mark.parametrize(
    ("after", "reason"),
    [
        (
            metrics_page(10 + 10_000 * 80, 120, 480),
            "canary: acceptance 10000.00 is impossible: accepted tokens grew faster than draft tokens "
            "(800,000 tokens accepted of 80 drafted)",
        ),
        (metrics_page(60, 100, 400), "canary: acceptance is impossible: 50 tokens accepted of 0 drafted"),
        (metrics_page(5, 20, 80), "canary: the server's counters went back (it restarted)"),
        (metrics_page("NaN", 120, 480), "canary: GET /metrics counts nan accepted tokens: not a count"),
        (metrics_page(500, 120, "+Inf"), "canary: GET /metrics counts inf draft tokens"),
        (metrics_page(500, 120, 1e300), "canary: GET /metrics counts 1e+300 draft tokens"),
        (metrics_page(-5, 120, 480), "canary: GET /metrics counts -5 accepted tokens"),
        (metrics_page(80.5, 120, 480), "canary: GET /metrics counts 80.5 accepted tokens"),
        ("<html>not metrics</html>", "canary: GET /metrics is not a Prometheus page"),
    ],
)
async def test_counters_that_cannot_be_so_fail_the_canary_with_the_reason(
    after: str,
    reason: str,
    aiohttp_server: AiohttpServer,
    store: Store,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vllm = FakeVllm()
    vllm.pages = [metrics_page(10, 100, 400), after]
    url = await start(aiohttp_server, vllm)
    said = await restore_refused(flag_action(tmp_path, url), store, tmp_path)
    assert said.startswith(reason), said
    no_traceback(caplog)


async def test_a_sequential_canary_refuses_impossible_counters_too(aiohttp_server: AiohttpServer) -> None:
    vllm = FakeVllm()
    vllm.pages = [metrics_page(0, 0, 0), metrics_page(10_000 * 80, 20, 80)]
    url = await start(aiohttp_server, vllm)
    sprt = {"in_control": 0.85, "shift_to": 0.4}
    result = await Canary(CanaryParams(url=url, sprt=sprt, requests=1), None).probe()
    assert not result.ok
    assert result.detail.startswith("canary: acceptance 10000.00 is impossible"), result.detail


@pytest.mark.parametrize(
    ("path", "declared"),
    [("/v1/completions", True), ("/v1/completions", False), ("/metrics", True), ("/metrics", False)],
)
async def test_an_800_mb_answer_fails_the_canary_and_is_not_read(
    path: str, declared: bool, aiohttp_server: AiohttpServer, store: Store, tmp_path: Path
) -> None:
    huge = HugeAnswer(declared=declared)
    url = await start(aiohttp_server, FakeVllm(), **{path: huge})
    action = flag_action(tmp_path, url)
    memory = PeakMemory()
    memory.start()
    said = await restore_refused(action, store, tmp_path)
    grew = memory.growth_mib()
    method = "POST" if path == "/v1/completions" else "GET"
    assert said.startswith(f"canary: {method} {url}{path} answered 200: the answer's body "), said
    assert "max_response_size 1 MiB" in said, said
    assert huge.sent < 64 * 2**20 * huge.requests, f"the server got {huge.sent:,} bytes out"
    assert grew < 50, f"peak memory grew {grew:.0f} MiB"


async def test_max_response_size_and_follow_redirects_apply_to_the_canary(
    aiohttp_server: AiohttpServer, store: Store, tmp_path: Path
) -> None:
    elsewhere = FakeVllm()
    other = await start(aiohttp_server, elsewhere)

    async def moved(request: Any) -> Any:
        from aiohttp import web

        raise web.HTTPFound(f"{other}/metrics")

    vllm = FakeVllm()
    url = await start(aiohttp_server, vllm, **{"/moved/metrics": moved})
    said = await restore_refused(flag_action(tmp_path, f"{url}/moved", model="m"), store, tmp_path)
    assert said == (
        f"canary: GET {url}/moved/metrics answered 302, a redirect to {other}/metrics: not followed "
        "(follow_redirects: never)"
    )
    action = flag_action(tmp_path, url)
    small = FeatureFlagAction(
        "fallback", action.flag.model_copy(update={"max_response_size": 1024})
    )  # a /metrics page is larger than 1 KiB
    vllm.pages = [metrics_page(0, 0, 0) + "# " + "x" * 2000 + "\n"]
    said = await restore_refused(small, store, tmp_path)
    assert said == (
        f"canary: GET {url}/metrics answered 200: the answer's body is 2,351 bytes, over max_response_size 1 KiB"
    )
