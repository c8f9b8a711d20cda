"""Fixtures for tests against real components: a real Prometheus scraping a local metrics server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.sim.slack_api import SlackApi, running
from specguard.store.database import Store
from tests.installed import Installed, build_and_install
from tests.processes import Daemon
from tests.prometheus_server import PrometheusServer, running_prometheus  # through pythonpath = ["."]
from tests.replay import ReplayedVllm


@dataclass
class MetricsServer:
    """A local ``/metrics`` endpoint; ``body`` is called on every scrape, so it may change."""

    target: str  # host:port, as Prometheus's config wants it
    body: Callable[[], str] = field(default=lambda: "")
    scrapes: int = 0


@pytest.fixture
async def metrics_server(aiohttp_server: AiohttpServer) -> MetricsServer:
    server = MetricsServer(target="")

    async def metrics(_: web.Request) -> web.Response:
        server.scrapes += 1
        return web.Response(text=server.body(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    running = await aiohttp_server(app, host="127.0.0.1")  # port 0: the OS picks a free one
    server.target = f"127.0.0.1:{running.port}"
    return server


@pytest.fixture
async def prometheus(
    metrics_server: MetricsServer, tmp_path: Path, unused_tcp_port: int
) -> AsyncIterator[PrometheusServer]:
    """A real Prometheus scraping ``metrics_server`` every second, stopped at teardown."""
    async with running_prometheus(metrics_server.target, tmp_path, unused_tcp_port) as server:
        yield server


@pytest.fixture
async def vllm(aiohttp_server: AiohttpServer) -> str:
    """The /metrics URL of a server replaying a real vLLM 0.32.0 capture (acceptance 0.6)."""
    replay = ReplayedVllm()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=replay(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}/metrics"


@pytest.fixture
async def daemons() -> AsyncIterator[list[Daemon]]:
    """Daemons a test starts; whatever is still running at the end is killed."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


@pytest.fixture
async def slack() -> AsyncIterator[SlackApi]:
    """A Slack Web API on loopback (sim/slack_api.py) for the test."""
    async with running() as api:
        yield api


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A real store (SQLite, WAL) in the test's own directory."""
    opened = Store(tmp_path / "specguard.db")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from this tree, installed into a fresh virtualenv (tests/installed.py)."""
    return build_and_install(tmp_path_factory.mktemp("installed"))
