"""The vllm_restart action reads vLLM's ``/health`` and ``/version`` as from a stranger: bodies up to
``max_response_size`` (a 200 ``/health`` with an endless or a huge declared body fails the check
with that reason, unread), no redirect followed; the restart's verification reads ``/metrics``
the same way. And a speculative config file that is a symbolic
link is written through to the file it points to, and stays a link."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from specguard.actions.base import ActionContext
from specguard.actions.vllm_restart import VllmRestartAction, VllmRestartParams, speculative
from specguard.actions.vllm_restart.server import NotReady, Server
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from tests.ports import free_port
from tests.vllm_host import DRAFT, Host

MiB = 1 << 20
CHUNK = b"0" * (64 << 10)


class Stranger:
    """A vLLM stand-in on loopback whose ``/health`` and ``/version`` answer as ``modes`` says:
    ``ok``; ``endless`` (200, a chunked body that goes on up to ``most`` bytes); ``declared``
    (200, Content-Length of 800 MB, then a trickle); ``redirect`` (307 to ``elsewhere``). It
    counts the body bytes it got written and the requests it had."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.modes = {"/health": "ok", "/version": "ok"}
        self.elsewhere = ""
        self.most = 400 * MiB
        self.sent = 0
        self.requests: list[str] = []
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.answer)
        app.router.add_get("/version", self.answer)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        mode = self.modes[request.path]
        if mode == "ok":
            return web.json_response({"version": "0.32.0"}) if request.path == "/version" else web.Response()
        if mode == "redirect":
            raise web.HTTPTemporaryRedirect(self.elsewhere + request.path)
        response = web.StreamResponse()
        if mode == "declared":
            response.content_length = 800_000_000
        await response.prepare(request)
        try:
            if request.path == "/version":
                await response.write(b'{"version": "')
            while self.sent < self.most:
                await response.write(CHUNK)
                self.sent += len(CHUNK)
                if mode == "declared":
                    await asyncio.sleep(0.05)
        except (ConnectionError, RuntimeError):  # the reader has gone
            pass
        return response


@pytest.fixture
async def stranger() -> AsyncIterator[Stranger]:
    served = Stranger()
    await served.start()
    yield served
    await served.stop()


@pytest.fixture
async def other() -> AsyncIterator[Stranger]:
    """Where a redirect leads: a healthy server that would say it runs another version."""
    served = Stranger()
    await served.start()
    yield served
    await served.stop()


async def test_a_health_answer_over_max_response_size_fails_the_check_with_the_reason(
    stranger: Stranger,
) -> None:
    stranger.modes["/health"] = "endless"
    server = Server(stranger.url, None, request_timeout=60)
    with pytest.raises(NotReady) as caught:
        await server.wait_healthy(timeout=2, poll=0.5)
    assert "(last: /health answered 200, but the answer's body passed max_response_size 1 MiB)" in str(
        caught.value
    )
    # each poll stopped reading past the limit: nowhere near the 400 MiB on offer (socket buffers aside)
    assert stranger.sent < 100 * MiB, stranger.sent

    stranger.modes["/health"] = "declared"
    stranger.sent = 0
    with pytest.raises(NotReady) as caught:
        await server.wait_healthy(timeout=1, poll=0.5)
    assert "the answer's body is 800,000,000 bytes, over max_response_size 1 MiB" in str(caught.value)

    stranger.modes["/health"] = "ok"
    assert await server.wait_healthy(timeout=30) >= 0


async def test_a_health_or_version_redirect_is_not_followed(stranger: Stranger, other: Stranger) -> None:
    stranger.elsewhere = other.url
    stranger.modes.update({"/health": "redirect", "/version": "redirect"})
    server = Server(stranger.url, None)
    with pytest.raises(NotReady) as caught:
        await server.wait_healthy(timeout=1, poll=0.5)
    assert f"(last: /health answered 307: a redirect to '{other.url}/health', not followed)" in str(
        caught.value
    )
    assert await server.version() is None
    assert other.requests == []


async def test_a_version_answer_over_max_response_size_is_no_version(stranger: Stranger) -> None:
    stranger.modes["/version"] = "endless"
    stranger.most = 48 * MiB  # a JSON string that size is what reading it whole would hold
    server = Server(stranger.url, None, request_timeout=60)
    assert await server.version() is None
    assert stranger.sent < 24 * MiB, stranger.sent
    stranger.modes["/version"] = "ok"
    assert await server.version() == "0.32.0"


def test_max_response_size_is_checked(tmp_path: Path) -> None:
    base = {"type": "vllm_restart", "ladder": [2, 0], "env_file": {"path": str(tmp_path / "s.env")},
            "unit": "vllm.service"}  # fmt: skip
    assert VllmRestartParams.model_validate(base).max_response_size == MiB
    assert VllmRestartParams.model_validate({**base, "max_response_size": "64KiB"}).max_response_size == 65536
    for value, why in (
        ("lots", "invalid size 'lots': give a number of bytes, or one with a unit"),
        (0, "a size of 0 bytes is outside 1 KiB to 1 GiB"),
        ("2GiB", "a size of 2,147,483,648 bytes is outside 1 KiB to 1 GiB"),
    ):
        with pytest.raises(ValidationError, match=why) as caught:
            VllmRestartParams.model_validate({**base, "max_response_size": value})
        assert "max_response_size" in str(caught.value)


async def test_the_action_reads_health_up_to_its_max_response_size(
    stranger: Stranger, tmp_path: Path
) -> None:
    stranger.modes["/health"] = "declared"
    raw = {"type": "vllm_restart", "ladder": [2, 0], "env_file": {"path": str(tmp_path / "s.env")},
           "unit": "vllm.service", "url": stranger.url, "max_response_size": "4KiB"}  # fmt: skip
    action = VllmRestartAction("shrink", VllmRestartParams.model_validate(raw))
    with pytest.raises(NotReady, match="over max_response_size 4 KiB"):
        await action.server.wait_healthy(timeout=1, poll=0.5)


@pytest.fixture(params=["env", "yaml"])
def linked(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    """A host whose speculative config is a relative symbolic link into another directory, as
    ``/etc/vllm/vllm.yaml -> ../../srv/vllm/vllm.yaml``."""
    served = Host(tmp_path, request.param)
    real = tmp_path / "real" / served.path.name
    real.parent.mkdir()
    served.path.rename(real)
    served.path.symlink_to(Path("real") / served.path.name)
    served.start()
    yield served
    served.stop()


async def test_a_symlinked_config_is_written_through_to_its_target_and_stays_a_link(
    linked: Host, store: Store
) -> None:
    link, target = linked.path, linked.path.parent / "real" / linked.path.name
    before = target.read_text()
    action = linked.action()
    await Server(linked.url, None).wait_healthy(30)
    context: dict[str, Any] = {"rule": "acceptance_critical", "event": "firing", "severity": "critical",
                               "labels": {}, "value": 0.1, "threshold": 0.3, "summary": "acceptance low",
                               "event_id": 1, "memory": StoreMemory(store, "shrink")}  # fmt: skip
    outcome = await action.run(ActionContext(**context))
    assert outcome.ok and "k 4 -> 2" in outcome.detail, outcome.detail
    assert "/metrics counts draft positions 0-1" in outcome.detail  # vLLM read the new k through the link
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / link.name)
    read = speculative.read_env if linked.style == "env" else speculative.read_yaml
    assert read(target.read_text(), "f") == {**DRAFT, "num_speculative_tokens": 2}
    assert target.with_name(target.name + ".prev").read_text() == before  # the target's previous text
    assert not link.with_name(link.name + ".prev").exists()
    assert sorted(p.name for p in link.parent.iterdir() if p.name.startswith(link.name)) == [link.name]


@pytest.mark.parametrize("mode", ["endless", "huge"])
async def test_the_restarts_verification_reads_metrics_up_to_its_limit(mode: str) -> None:
    from tests.hostile_deps import HostileDeps

    with HostileDeps() as deps:
        deps.set("/vllm/metrics", mode)  # the rest of the server answers as vLLM does
        server = Server(deps.url("/vllm"), None, max_response_size=MiB)
        with pytest.raises(
            NotReady,
            match=r"^verification: the answer's body (passed|is 838,860,800 bytes, over) max_response_size 1 MiB",
        ):
            await server.verify(2, 1, 8, None)
        assert deps.served_count("/vllm/v1/completions") == 1  # it got as far as the page
