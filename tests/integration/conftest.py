"""Fixtures for tests against real components: a real Prometheus scraping a local metrics server."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.real import require_binary  # importable through pytest's pythonpath = ["."]
from tests.replay import ReplayedVllm

READY_TIMEOUT = 20.0

PROMETHEUS_CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: ["{target}"]
"""


@dataclass
class MetricsServer:
    """A local ``/metrics`` endpoint; ``body`` is called on every scrape, so it may change."""

    target: str  # host:port, as Prometheus's config wants it
    body: Callable[[], str] = field(default=lambda: "")
    scrapes: int = 0


@dataclass
class PrometheusServer:
    url: str
    log: Path


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
    binary = require_binary("prometheus", "prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_CONFIG.format(target=metrics_server.target))
    server = PrometheusServer(f"http://127.0.0.1:{unused_tcp_port}", tmp_path / "prometheus.log")
    with server.log.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{unused_tcp_port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        await _wait_ready(server, process)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _wait_ready(server: PrometheusServer, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited with {process.returncode}:\n{_tail(server.log)}")
            try:
                async with session.get(f"{server.url}/-/ready") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass  # not listening yet
            await asyncio.sleep(0.1)
    pytest.fail(f"prometheus not ready after {READY_TIMEOUT}s:\n{_tail(server.log)}")


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-20:])


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
