"""The feature_flag action's nginx backend against a small admin location on loopback (aiohttp,
answering as the router's Lua does, or with errors from a script), the flag file on disk, and the
configuration's bad input, including ``specguard check``'s comparison with the ``routing:`` section."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError
from pytest_aiohttp import AiohttpServer

from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.feature_flag.backends import BackendError
from specguard.actions.feature_flag.nginx import NginxBackend, NginxParams, file_says
from specguard.config.loading import load
from specguard.store.database import Store
from specguard.store.memory import StoreMemory


class Admin:
    """The router's admin location: holds the flag as the Lua does; ``script`` holds answers to
    give instead, in order (a status, ``"slow"`` for one that never comes in time, ``"liar"``
    for a 200 whose body says the other value than the one sent)."""

    def __init__(self) -> None:
        self.fallback = False
        self.script: list[int | str] = []
        self.puts: list[tuple[Any, float]] = []

    async def handle(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            body = await request.json()
            self.puts.append((body, time.monotonic()))
        step = self.script.pop(0) if self.script and request.method == "PUT" else 200
        if step == "slow":
            await asyncio.sleep(5)
        if step == "liar":
            return web.json_response({"fallback": not body["fallback"]})
        if isinstance(step, int) and step != 200:
            return web.json_response({"error": f"scripted {step}"}, status=step)
        if request.method == "PUT":
            if not isinstance(body, dict) or not isinstance(body.get("fallback"), bool):
                return web.json_response({"error": "the body must be {fallback: bool}"}, status=400)
            self.fallback = body["fallback"]
        return web.json_response({"fallback": self.fallback, "source": "admin"})


@pytest.fixture
async def admin(aiohttp_server: AiohttpServer) -> tuple[Admin, str]:
    state = Admin()
    app = web.Application()
    app.router.add_route("*", "/specguard/flag", state.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    return state, f"http://127.0.0.1:{server.port}"


def params(url: str, flag: Path, **extra: Any) -> NginxParams:
    return NginxParams.model_validate({"admin_url": url, "flag_file": str(flag), "backoff": 0.05, **extra})


def nginx_action(url: str, flag: Path, **extra: Any) -> FeatureFlagAction:
    raw = {
        "type": "feature_flag",
        "nginx": {"admin_url": url, "flag_file": str(flag), "backoff": 0.05, **extra},
    }
    return FeatureFlagAction("fallback", FeatureFlagParams.model_validate(raw))


# --- the backend ---------------------------------------------------------------------------------


async def test_engage_writes_the_file_first_then_puts_and_both_read_back(
    admin: tuple[Admin, str], tmp_path: Path
) -> None:
    state, url = admin
    flag = tmp_path / "flag.json"
    flag.write_text('{"fallback": false}')
    seen: list[Any] = []

    class Watching(NginxBackend):
        async def _put(self, engage: bool, what: str) -> str:
            seen.append(json.loads(flag.read_text()))  # the file, as the PUT leaves: already written
            return await super()._put(engage, what)

    backend = Watching(params(url, flag))
    done = await backend.set({"fallback": True}, "engage")
    assert done == f"wrote {flag}; PUT {url}/specguard/flag: 200"
    assert seen == [{"fallback": True}] and state.fallback is True
    assert json.loads((tmp_path / "flag.json.prev").read_text()) == {"fallback": False}
    assert file_says(flag.read_text()) is True
    assert await backend.read() == "engaged"

    again = await backend.set({"fallback": True}, "engage")  # made again after a crash: the same
    assert again.startswith(f"{flag} already says so; PUT") and state.fallback is True
    assert await backend.read() == "engaged"

    assert (await backend.set({"fallback": False}, "restore")).startswith(f"wrote {flag}")
    assert state.fallback is False and await backend.read() == "restored"


async def test_read_is_unknown_when_the_router_and_its_file_disagree(
    admin: tuple[Admin, str], tmp_path: Path
) -> None:
    state, url = admin
    flag = tmp_path / "flag.json"
    backend = NginxBackend(params(url, flag))
    assert await backend.read() == "restored"  # no file: nginx starts not engaged, and says so
    state.fallback = True  # engaged by hand through the admin location; the file says nothing
    assert await backend.read() == "unknown"
    flag.write_text('{"fallback": true}')
    assert await backend.read() == "engaged"
    state.fallback = False  # restored by hand through the admin location
    assert await backend.read() == "unknown"
    flag.write_text("not json")  # nginx reads that as not engaged: so does the backend
    assert await backend.read() == "restored"


async def test_read_is_none_when_the_admin_location_cannot_be_read(
    aiohttp_server: AiohttpServer, tmp_path: Path, unused_tcp_port: int
) -> None:
    flag = tmp_path / "flag.json"
    flag.write_text('{"fallback": true}')
    assert await NginxBackend(params(f"http://127.0.0.1:{unused_tcp_port}", flag)).read() is None

    async def odd(request: web.Request) -> web.Response:
        return web.json_response({"enabled": "yes"})

    app = web.Application()
    app.router.add_get("/specguard/flag", odd)
    server = await aiohttp_server(app, host="127.0.0.1")
    assert await NginxBackend(params(f"http://127.0.0.1:{server.port}", flag)).read() is None


async def test_5xx_is_retried_with_doubling_waits_and_a_4xx_fails_at_once_with_its_reason(
    admin: tuple[Admin, str], tmp_path: Path
) -> None:
    state, url = admin
    backend = NginxBackend(params(url, tmp_path / "flag.json", retries=2))
    state.script = [503, 502]
    assert (await backend.set({"fallback": True}, "engage")).endswith("200 after 2 retries")
    times = [at for _, at in state.puts]
    assert times[1] - times[0] >= 0.05 and times[2] - times[1] >= 0.1  # 50 ms, then 100 ms
    assert state.fallback is True

    state.puts.clear()
    state.script = [400]
    with pytest.raises(BackendError, match=r"restore: PUT .*/specguard/flag answered 400 .*scripted 400"):
        await backend.set({"fallback": False}, "restore")
    assert len(state.puts) == 1  # a body the router refuses is not sent again

    state.puts.clear()
    state.script = [500, 500, 500]
    with pytest.raises(BackendError, match=r"failed 3 times, last: 500"):
        await backend.set({"fallback": False}, "restore")
    assert len(state.puts) == 3


async def test_a_timeout_and_a_body_that_disagrees_are_tried_again(
    admin: tuple[Admin, str], tmp_path: Path
) -> None:
    state, url = admin
    backend = NginxBackend(params(url, tmp_path / "flag.json", retries=1, request_timeout=1.0))
    state.script = ["slow"]
    assert (await backend.set({"fallback": True}, "engage")).endswith("200 after 1 retries")
    state.script = ["liar", "liar"]
    with pytest.raises(BackendError, match=r"failed 2 times, last: 200 saying .*not fallback false"):
        await backend.set({"fallback": False}, "restore")


async def test_connection_refused_is_retried_then_reported(tmp_path: Path, unused_tcp_port: int) -> None:
    backend = NginxBackend(params(f"http://127.0.0.1:{unused_tcp_port}", tmp_path / "flag.json", retries=1))
    with pytest.raises(BackendError, match=r"failed 2 times, last: Client"):
        await backend.set({"fallback": True}, "engage")
    assert file_says((tmp_path / "flag.json").read_text()) is True  # the file was written first


async def test_an_unwritable_flag_file_fails_before_the_router_is_told(
    admin: tuple[Admin, str], tmp_path: Path
) -> None:
    state, url = admin
    backend = NginxBackend(params(url, tmp_path / "missing-dir" / "flag.json"))
    with pytest.raises(BackendError, match=r"engage: cannot write .*missing-dir/flag.json"):
        await backend.set({"fallback": True}, "engage")
    assert state.puts == [] and state.fallback is False


async def test_the_action_journals_unknown_and_a_disagreement_is_written_again(
    admin: tuple[Admin, str], tmp_path: Path, store: Store
) -> None:
    state, url = admin
    action = nginx_action(url, tmp_path / "flag.json")
    memory = StoreMemory(store, "fallback")
    state.script = [400]
    failed = await action.engage(memory)
    assert not failed.ok and "answered 400" in failed.detail
    assert (await store.memory_read("fallback", "flag"))["state"] == "unknown"
    assert await action.read_world() == "unknown"  # the file says engaged, the router does not
    done = await action.engage(memory)
    assert done.ok and done.detail.startswith("fallback engaged: ")
    assert (await store.memory_read("fallback", "flag"))["state"] == "engaged"
    assert await action.read_world() == "engaged"
    assert action.read_every == 0.0


# --- the configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://10.0.0.5:8081", "loopback only"),
        ("http://router.internal:8081", "loopback only"),
        ("https://127.0.0.1:8081", "http://HOST:PORT"),
        ("127.0.0.1:8081", "http://HOST:PORT"),
        ("http://127.0.0.1:8081/specguard/flag", "specguard adds /specguard/flag"),
        ("http://", "http://HOST:PORT"),
        ("http://[::1:8081", "http://HOST:PORT"),
    ],
)
def test_admin_url_must_be_http_on_loopback(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as caught:
        NginxParams.model_validate({"admin_url": url, "flag_file": "flag.json"})
    assert caught.value.errors()[0]["loc"] == ("admin_url",)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8081", "http://localhost:8081/", "http://[::1]:8081"])
def test_admin_url_on_loopback_is_taken(url: str) -> None:
    given = NginxParams.model_validate({"admin_url": url, "flag_file": "flag.json"})
    assert not given.admin_url.endswith("/") and given.flag_url.endswith(":8081/specguard/flag")


def test_exactly_one_backend() -> None:
    nginx = {"admin_url": "http://127.0.0.1:8081", "flag_file": "flag.json"}
    with pytest.raises(ValidationError, match=r"exactly one backend.*; none is given"):
        FeatureFlagParams.model_validate({"type": "feature_flag"})
    with pytest.raises(ValidationError, match=r"not `http` and `nginx`"):
        FeatureFlagParams.model_validate(
            {"type": "feature_flag", "http": {"url": "http://r/f"}, "nginx": nginx}
        )
    file = {"path": "f.json", "engage": {}, "restore": {}}
    with pytest.raises(ValidationError, match=r"not `file` and `nginx`"):
        FeatureFlagParams.model_validate({"type": "feature_flag", "file": file, "nginx": nginx})


def test_the_timeout_must_hold_the_routers_tries() -> None:
    nginx = {
        "admin_url": "http://127.0.0.1:8081",
        "flag_file": "flag.json",
        "retries": 3,
        "request_timeout": "10s",
    }
    # 1 s for the file, 4 tries of 10 s, waits of 1 + 2 + 4 s: 48 s
    assert FeatureFlagParams.model_validate({"type": "feature_flag", "nginx": nginx}).longest_write() == 48.0
    with pytest.raises(
        ValidationError, match=r"timeout 47s cannot hold a restore, which may take 48s.*nginx.retries"
    ):
        FeatureFlagParams.model_validate({"type": "feature_flag", "nginx": nginx, "timeout": "47s"})


ROUTED = """\
state_dir: state
rules: [rules.yaml]
routing:
  admin_listen: 127.0.0.1:8081
  flag_file: routing-flag.json
  pools: {speculative: {servers: ["127.0.0.1:8000"]}, standard: {servers: ["127.0.0.1:8001"]}}
  default_pool: speculative
  fallback_pool: standard
actions:
  fallback:
    type: feature_flag
    nginx:
      admin_url: ADMIN
      flag_file: FLAG
"""


def checked(tmp_path: Path, admin_url: str, flag: str) -> list[str]:
    (tmp_path / "rules.yaml").write_text(
        textwrap.dedent("""\
        rules:
          - name: low
            signal: acceptance_rate
            condition: "< 0.4"
            actions: [fallback]
        """)
    )
    (tmp_path / "c.yaml").write_text(ROUTED.replace("ADMIN", admin_url).replace("FLAG", flag))
    return [str(problem) for problem in load(tmp_path / "c.yaml").problems]


def test_check_compares_the_nginx_backend_with_the_routing_section(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    assert checked(tmp_path, "http://127.0.0.1:8081", "routing-flag.json") == []
    assert checked(tmp_path, "http://localhost:8081", str(tmp_path / "routing-flag.json")) == []
    (problem,) = checked(tmp_path, "http://127.0.0.1:9000", "routing-flag.json")
    assert problem.startswith(f"{config}:13: actions.fallback.nginx.admin_url: http://127.0.0.1:9000 is not ")
    (problem,) = checked(tmp_path, "http://127.0.0.1:8081", "other.json")
    assert problem.startswith(
        f"{config}:14: actions.fallback.nginx.flag_file: {tmp_path / 'other.json'} is not"
    )
    (problem,) = checked(tmp_path, "http://127.0.0.1:9000", "other.json")  # another router, maybe
    assert problem.startswith(f"{config}:12: warning: actions.fallback.nginx: names neither")
