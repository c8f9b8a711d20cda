"""A real nginx running specguard's rendered router, for tests: rendered from a ``routing:`` mapping
with ``specguard routing render --standalone`` into a directory of the test's, started in the
foreground on loopback ports, reloaded and stopped on request."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.nginx_test import lua_modules
from specguard.playbook.routing.render import Standalone, render
from specguard.playbook.routing.running import START_TIMEOUT, RunningNginx
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


class Router(RunningNginx):
    """A test's nginx: the router rendered from ``routing`` into ``directory``, one worker."""

    def __init__(self, directory: Path, routing: dict[str, Any], workers: int = 1) -> None:
        self.config = RoutingConfig.model_validate(routing)
        super().__init__(require_nginx(), directory, (self.config.listen, self.config.admin_listen))
        user = "root" if os.geteuid() == 0 else None  # workers must reach the test's 0700 directories
        self.standalone = Standalone(user=user, workers=workers)

    @property
    def url(self) -> str:
        return f"http://{self.config.listen}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.config.admin_listen}"

    @property
    def access_log(self) -> Path:
        return self.directory / "logs" / "access.log"

    def render(self) -> None:
        render(self.config, self.directory, "the test's routing config", self.standalone)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        self.render()
        super().start(timeout)

    def __enter__(self) -> Router:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
