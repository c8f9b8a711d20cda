"""A real Prometheus (the Debian package) over blocks made with promtool, on loopback, for the fleet
benchmark: no scraping, only the series backfilled from OpenMetrics text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType

READY_TIMEOUT = 120.0
MINIMAL_CONFIG = '{"global": {"scrape_interval": "15s"}, "scrape_configs": []}\n'  # JSON is YAML


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install Prometheus (Debian: apt-get install prometheus)")
    return found


def create_blocks(openmetrics: Path, data: Path) -> tuple[float, float]:
    """``promtool tsdb create-blocks-from openmetrics``: the seconds it took and its peak RSS (MiB)."""
    started = time.monotonic()
    output = data.parent / "promtool.out"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics), str(data)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:
            process.kill()
            process.wait()
            raise
    process.returncode = code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"promtool failed ({code}):\n{output.read_text(errors='replace')[-4000:]}")
    return time.monotonic() - started, usage.ru_maxrss / 1024


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of process ``pid``, in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


class Prometheus:
    """``with Prometheus(data, port, directory) as prom``: started on 127.0.0.1:``port`` over the blocks
    in ``data``, ready when its HTTP API answers; stopped (SIGTERM, then SIGKILL) on the way out."""

    def __init__(self, data: Path, port: int, directory: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.data = data
        self.port = port
        self.log = directory / f"prometheus-{port}.log"
        self.config = directory / "prometheus.yml"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.ready_after = 0.0  # seconds from the start to a ready HTTP API

    def __enter__(self) -> Prometheus:
        self.config.write_text(MINIMAL_CONFIG)
        self.started = time.monotonic()
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_after = time.monotonic() - self.started
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, 9)
            self.process.wait()

    def query(self, expr: str, at: float) -> list[dict[str, object]]:
        """An instant query's ``data.result``."""
        params = urllib.parse.urlencode({"query": expr, "time": repr(at)})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=60) as answer:
            body = json.loads(answer.read())
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def series_count(self, at: float) -> int:
        """How many vLLM series Prometheus holds at ``at`` (within its 5-minute lookback)."""
        result = self.query('count({__name__=~"vllm:.+"})', at)
        if not result:
            return 0
        value = result[0]["value"]
        assert isinstance(value, list)
        return int(float(value[1]))

    def wait_series(self, expected: int, at: float) -> float:
        """Wait until every one of the ``expected`` series is queryable: the seconds from the start."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            count = self.series_count(at)
            if count == expected:
                return time.monotonic() - self.started
            if time.monotonic() > deadline:
                raise SystemExit(f"prometheus holds {count} of {expected} series:\n{self._tail()}")
            time.sleep(0.2)

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"prometheus exited with {self.process.returncode}:\n{self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or still loading its blocks (503)
            time.sleep(0.1)
        raise SystemExit(f"prometheus not ready after {READY_TIMEOUT:g} s:\n{self._tail()}")

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
