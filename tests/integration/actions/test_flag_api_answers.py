"""The feature flag's HTTP flag API answering as a hostile server would, on loopback: bodies of
800 MB, redirects to elsewhere and in circles, Retry-After that says forever. The answer is read up
to max_response_size, a redirect followed only where configured, and Retry-After honoured within
the action's own bound; each failure says why and names the URL that answered."""

from __future__ import annotations

import inspect
import json
import math
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from tests.flag_servers import HugeAnswer, PeakMemory

ENGAGE = {"speculative": False}


def flag_action(url: str, **extra: Any) -> FeatureFlagAction:
    http = {"url": url, "engage": ENGAGE, "restore": {"speculative": True}, "retries": 0, "backoff": "50ms"}
    raw = {"type": "feature_flag", "http": {**http, **extra.pop("http", {})}, "quiet_period": "0s", **extra}
    return FeatureFlagAction("fallback", FeatureFlagParams.model_validate(raw))


class Recorder:
    """A handler that records the requests it gets and answers ``status`` with ``headers``."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self.seen: list[tuple[str, str, Any]] = []

    async def __call__(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.seen.append((request.method, request.path, body))
        return web.json_response({"ok": self.status < 300}, status=self.status, headers=self.headers)


async def serve(aiohttp_server: AiohttpServer, routes: dict[str, Any]) -> str:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler if inspect.iscoroutinefunction(handler) else handler.__call__)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


# --- bodies over max_response_size -------------------------------------------------------------


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_an_800_mb_answer_fails_the_write_and_is_not_read(
    declared: bool, aiohttp_server: AiohttpServer, store: Store
) -> None:
    huge = HugeAnswer(status=500, declared=declared)
    base = await serve(aiohttp_server, {"/flags/speculative": huge})
    action = flag_action(f"{base}/flags/speculative")
    memory = PeakMemory()
    memory.start()
    outcome = await action.engage(StoreMemory(store, "fallback"))
    grew = memory.growth_mib()
    assert not outcome.ok and outcome.retry_after == 10.0
    said = (
        "the answer's body is 800,000,000 bytes, over max_response_size 1 MiB"
        if declared
        else "the answer's body passed max_response_size 1 MiB"
    )
    assert f"PUT {base}/flags/speculative answered 500: {said}" in outcome.detail, outcome.detail
    assert huge.sent < 64 * 2**20, f"the server got {huge.sent:,} bytes out"  # of 800 MB
    assert grew < 50, f"peak memory grew {grew:.0f} MiB"
    assert (await store.memory_read("fallback", "flag"))["state"] == "unknown"


async def test_a_read_back_over_the_limit_reads_as_unknown_and_max_response_size_sets_the_limit(
    aiohttp_server: AiohttpServer,
) -> None:
    huge = HugeAnswer(status=200, declared=False)

    async def padded_flag(request: web.Request) -> web.Response:
        return web.json_response({**ENGAGE, "notes": "n" * 3000})  # 3 KB

    base = await serve(
        aiohttp_server, {"/huge": huge, "/padded": padded_flag, "/flags/speculative": Recorder()}
    )
    url = f"{base}/flags/speculative"
    assert await flag_action(url, http={"read_url": f"{base}/huge"}).read_world() is None
    assert huge.sent < 64 * 2**20
    assert await flag_action(url, http={"read_url": f"{base}/padded"}).read_world() == "engaged"
    small = flag_action(url, http={"read_url": f"{base}/padded"}, max_response_size="2KiB")
    assert small.flag.max_response_size == 2048
    assert await small.read_world() is None


# --- redirects ---------------------------------------------------------------------------------


@pytest.mark.parametrize("follow", ["never", "same_origin"])
async def test_a_redirect_to_another_host_is_not_followed_and_the_outcome_names_it(
    follow: str, aiohttp_server: AiohttpServer, store: Store
) -> None:
    elsewhere = Recorder()
    other = await serve(aiohttp_server, {"/flags/speculative": elsewhere})
    moved = Recorder(307, {"Location": f"{other}/flags/speculative"})
    base = await serve(aiohttp_server, {"/flags/speculative": moved})
    action = flag_action(f"{base}/flags/speculative", follow_redirects=follow, http={"retries": 2})
    outcome = await action.engage(StoreMemory(store, "fallback"))
    assert not outcome.ok
    assert (
        f"engage: PUT {base}/flags/speculative answered 307, a redirect to {other}/flags/speculative: "
    ) in outcome.detail, outcome.detail
    assert elsewhere.seen == []  # nothing went to the other host
    assert len(moved.seen) == 1  # a redirect not followed is not asked again
    assert (await store.memory_read("fallback", "flag"))["state"] == "unknown"


async def test_a_same_origin_redirect_is_followed_only_when_configured_and_named(
    aiohttp_server: AiohttpServer, store: Store
) -> None:
    new = Recorder()
    base = await serve(
        aiohttp_server,
        {
            "/old": Recorder(308, {"Location": "/new"}),
            "/new": new,
            "/see": Recorder(303, {"Location": "/new"}),
        },
    )
    refused = await flag_action(f"{base}/old").engage(StoreMemory(store, "fallback"))
    assert (
        not refused.ok
        and "answered 308, a redirect to /new: not followed (follow_redirects: never)" in refused.detail
    )
    assert new.seen == []

    followed = await flag_action(f"{base}/old", follow_redirects="same_origin").engage(
        StoreMemory(store, "fallback")
    )
    assert followed.ok, followed.detail
    assert followed.detail == f"fallback engaged: PUT {base}/new (redirected from {base}/old): 200"
    assert new.seen == [("PUT", "/new", ENGAGE)]  # the method and the body kept

    to_get = await flag_action(f"{base}/see", follow_redirects="same_origin").engage(
        StoreMemory(store, "fallback")
    )
    assert not to_get.ok and "that would turn the PUT into a GET: not followed" in to_get.detail
    assert len(new.seen) == 1


async def test_a_redirect_loop_costs_at_most_the_hop_bound(
    aiohttp_server: AiohttpServer, store: Store
) -> None:
    hops: list[int] = []

    async def onward(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        hops.append(n)
        raise web.HTTPTemporaryRedirect(f"/hop/{n + 1}")

    circle = Recorder(307, {"Location": "/circle"})
    base = await serve(aiohttp_server, {"/hop/{n}": onward, "/circle": circle})
    memory = StoreMemory(store, "fallback")
    outcome = await flag_action(f"{base}/hop/0", follow_redirects="same_origin", http={"retries": 3}).engage(
        memory
    )
    assert not outcome.ok and "more than 5 redirects" in outcome.detail, outcome.detail
    assert f"PUT {base}/hop/5 (redirected from {base}/hop/0) answered 307" in outcome.detail
    assert hops == [0, 1, 2, 3, 4, 5]  # the first request and 5 hops; no retry of the whole
    outcome = await flag_action(f"{base}/circle", follow_redirects="same_origin").engage(memory)
    assert not outcome.ok and "a redirect back to" in outcome.detail and "a loop" in outcome.detail
    assert len(circle.seen) == 1
    hops.clear()
    await flag_action(f"{base}/hop/0", http={"retries": 3}).engage(memory)
    assert hops == [0]


# --- Retry-After -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "requests", "wait"),
    [
        ("inf", 3, 10.0),  # not finite: the action's own backoff
        ("NaN", 3, 10.0),
        ("-5", 3, 10.0),
        ("soon", 3, 10.0),
        ("0.01", 3, 10.0),  # shorter than the next retry's wait: the retries honour it
        ("999999999", 1, 300.0),  # years: capped at retry_max_backoff
        ("120", 1, 120.0),
        ("date", 1, None),  # an HTTP date two minutes ahead
    ],
)
async def test_retry_after_is_honoured_finite_and_capped(
    header: str, requests: int, wait: float | None, aiohttp_server: AiohttpServer, store: Store
) -> None:
    value = formatdate(time.time() + 120, usegmt=True) if header == "date" else header
    busy = Recorder(429, {"Retry-After": value})
    base = await serve(aiohttp_server, {"/flags/speculative": busy})
    action = flag_action(f"{base}/flags/speculative", http={"retries": 2}, retry_max_backoff="5m")
    outcome = await action.engage(StoreMemory(store, "fallback"))
    assert not outcome.ok and len(busy.seen) == requests
    assert outcome.retry_after is not None and math.isfinite(outcome.retry_after)
    if wait is None:
        assert 100 <= outcome.retry_after <= 120, outcome.detail
        assert "(Retry-After)" in outcome.detail
    else:
        assert outcome.retry_after == wait, outcome.detail
    if requests == 1:
        assert "it asked to be tried again in" in outcome.detail, outcome.detail
    record = await store.memory_read("fallback", "flag")
    json.dumps(record, allow_nan=False)  # nothing stored is not finite


# --- a symbolic link to the flag file ---------------------------------------------------------


async def test_a_flag_file_that_is_a_link_is_written_through(tmp_path: Path, store: Store) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "flag.json"
    real.write_text('{"speculative": true}\n')
    link = tmp_path / "etc" / "flag.json"
    link.symlink_to(Path("..") / "real" / "flag.json")
    params = FeatureFlagParams.model_validate(
        {
            "type": "feature_flag",
            "file": {"path": str(link), "engage": ENGAGE, "restore": {"speculative": True}},
        }
    )
    action = FeatureFlagAction("fallback", params)
    memory = StoreMemory(store, "fallback")
    outcome = await action.engage(memory)
    assert outcome.ok, outcome.detail
    assert json.loads(real.read_text()) == ENGAGE  # what the router reads
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert outcome.detail == f"fallback engaged: wrote {real.resolve()} (the file {link} links to)"
    assert (tmp_path / "real" / "flag.json.prev").read_text() == '{"speculative": true}\n'
    assert await action.read_world() == "engaged"
    assert (await action.restore_flag(memory)).ok and json.loads(real.read_text()) == {"speculative": True}
    assert link.is_symlink()
