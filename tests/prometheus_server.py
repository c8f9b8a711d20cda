"""A real Prometheus (the Debian package) for the integration tier: started on loopback, scraping its
targets every second, stopped when the test ends. Missing binary: skip, or fail under
SPECGUARD_REQUIRE_REAL=1 (tests/real.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.real import require_binary

READY_TIMEOUT = 20.0

SCRAPE_EVERY = "1s"


def prometheus_config(jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()) -> str:
    """prometheus.yml scraping each job's targets (host:port) every second, loading ``rule_files``.
    JSON is YAML."""
    return json.dumps(
        {
            "global": {"scrape_interval": SCRAPE_EVERY, "scrape_timeout": SCRAPE_EVERY},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ],
            **({"rule_files": [str(p) for p in rule_files]} if rule_files else {}),
        },
        indent=2,
    )


@dataclass
class PrometheusServer:
    url: str
    log: Path


@asynccontextmanager
async def running_prometheus(
    target: str | Mapping[str, Sequence[str]],
    directory: Path,
    port: int,
    rule_files: Sequence[Path] = (),
    tsdb: Path | None = None,
) -> AsyncIterator[PrometheusServer]:
    """A real Prometheus on 127.0.0.1:``port`` scraping every second ``target`` (host:port, as job
    ``vllm``), or each job's targets (``{"vllm": [...], "specguard": [...]}``; ``{}``: none), with
    ``rule_files``. ``tsdb``: serve the blocks there (``write_blocks``), kept however old they are."""
    binary = require_binary("prometheus", "prometheus")
    config = directory / "prometheus.yml"
    jobs = {"vllm": [target]} if isinstance(target, str) else target
    config.write_text(prometheus_config(jobs, rule_files))
    server = PrometheusServer(f"http://127.0.0.1:{port}", directory / "prometheus.log")
    with server.log.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb or directory / 'data'}",
                *(["--storage.tsdb.retention.time=100y"] if tsdb is not None else []),
                f"--web.listen-address=127.0.0.1:{port}",
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


def write_blocks(openmetrics: str, directory: Path) -> Path:
    """``openmetrics`` (text with timestamps, ending in ``# EOF``) written into TSDB blocks with
    ``promtool tsdb create-blocks-from openmetrics``, for ``running_prometheus(tsdb=...)``."""
    promtool = require_binary("promtool", "prometheus")
    source = directory / "samples.om"
    source.write_text(openmetrics)
    data = directory / "tsdb"
    made = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(data)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return data
