"""A real nginx running specguard's rendered router, for tests: rendered from a ``routing:`` mapping
with ``specguard routing render --standalone`` into a directory of the test's, started in the
foreground on loopback ports, reloaded and stopped on request."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.nginx_test import lua_modules
from specguard.playbook.routing.render import Standalone, nginx_command, render
from tests.ports import free_port
from tests.real import missing, require_binary


def require_nginx() -> str:
    """nginx with the Lua module and lua-cjson (Debian: nginx, libnginx-mod-http-lua, lua-cjson);
    skip, or fail under SPECGUARD_REQUIRE_REAL=1, without them."""
    binary = require_binary("nginx", "nginx")
    modules = lua_modules(binary)
    if isinstance(modules, str):
        missing(f"{modules} (apt-get install libnginx-mod-http-lua lua-cjson)")
    return binary


def routing_config(speculative: str, standard: str, flag_file: Path, **extra: Any) -> dict[str, Any]:
    """A ``routing:`` mapping with the playbook's three classes, on free loopback ports."""
    return {
        "listen": f"127.0.0.1:{free_port()}",
        "admin_listen": f"127.0.0.1:{free_port()}",
        "flag_file": str(flag_file),
        "pools": {"speculative": {"servers": [speculative]}, "standard": {"servers": [standard]}},
        "default_pool": "speculative",
        "fallback_pool": "standard",
        "classes": [
            {"name": "high_temperature", "pool": "standard", "when": {"temperature": {"gt": 1.0}}},
            {"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}},
            {
                "name": "short_unstreamed",
                "pool": "standard",
                "when": {"stream": False, "max_tokens": {"lt": 64}},
            },
        ],
        **extra,
    }


def _wait_port(address: str, deadline: float) -> None:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Router:
    """nginx in the foreground (``daemon off``), its files under ``directory``."""

    def __init__(self, directory: Path, routing: dict[str, Any], workers: int = 1) -> None:
        self.binary = require_nginx()
        self.directory = directory.resolve()
        self.config = RoutingConfig.model_validate(routing)
        user = "root" if os.geteuid() == 0 else None  # workers must reach the test's 0700 directories
        self.standalone = Standalone(user=user, workers=workers)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.listen}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.config.admin_listen}"

    @property
    def error_log(self) -> Path:
        return self.directory / "logs" / "error.log"

    @property
    def access_log(self) -> Path:
        return self.directory / "logs" / "access.log"

    def _args(self, *extra: str) -> list[str]:
        return nginx_command(self.binary, self.directory, *extra)

    def render(self) -> None:
        render(self.config, self.directory, "the test's routing config", self.standalone)

    def start(self, timeout: float = 20.0) -> Router:
        self.render()
        self.process = subprocess.Popen(
            self._args("-g", "daemon off;"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        try:
            _wait_port(self.config.listen, deadline)
            _wait_port(self.config.admin_listen, deadline)
        except OSError:
            self.stop()
            raise RuntimeError(
                f"nginx did not start: {self.error_log.read_text(errors='replace')[-2000:]}"
            ) from None
        return self

    def workers(self) -> set[int]:
        """The pids of the master's worker processes."""
        assert self.process is not None
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes() if (entry / "cmdline").exists() else b""
            if (
                int(fields[1]) == self.process.pid
                and b"worker process" in cmdline
                and b"shutting" not in cmdline
            ):
                found.add(int(entry.name))
        return found

    def reload(self, timeout: float = 20.0) -> None:
        """``nginx -s reload``, and wait until the workers that serve the new configuration run."""
        before = self.workers()
        subprocess.run(self._args("-s", "reload"), check=True, capture_output=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            now = self.workers()
            if now and not now & before:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start new workers: {self.error_log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
