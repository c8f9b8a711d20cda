"""The demo's router: specguard's nginx router (rendered from the demo's ``routing:`` section,
nginx in the foreground on loopback ports, stopped at the end) when nginx, its Lua module and
lua-cjson are installed, the demo's own (``sim.flag_router``, reading a flag file) otherwise or when
asked for.

``--router auto`` (the default) takes nginx when it can run the router, and says which it took and
why; ``--router nginx`` requires it; ``--router builtin`` never starts it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.nginx_test import lua_modules
from specguard.playbook.routing.render import Standalone, render
from specguard.playbook.routing.running import RunningNginx

MODES = ("auto", "builtin", "nginx")
NGINX_DIR = "nginx"  # under the demo's directory: the rendered files, nginx's pid, logs and temp files
START_TIMEOUT = 15.0
_REQUESTS = re.compile(r'^specguard_route_requests_total\{class="[^"]*",pool="([^"]*)"\} (\d+)$', re.M)


@dataclass(frozen=True)
class Choice:
    """The router the demo runs: nginx (``binary`` set) or its own, and why."""

    binary: str | None
    modules: Path | None  # where load_module finds the Lua module; None: built into nginx
    version: str  # nginx's, e.g. 1.22.1
    why: str  # for the demo's own router: why not nginx
    forced: bool = False  # --router nginx: no falling back to the demo's own router

    @property
    def nginx(self) -> bool:
        return self.binary is not None


def builtin(why: str) -> Choice:
    return Choice(None, None, "", why)


def find_nginx() -> Choice:
    """nginx able to run the router here, or the demo's own router and what is missing."""
    binary = shutil.which("nginx")
    if binary is None:
        return builtin("nginx is not installed")
    modules = lua_modules(binary)
    if isinstance(modules, str):
        return builtin(modules)
    said = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10).stderr
    version = said.strip().removeprefix("nginx version: ").removeprefix("nginx/")
    return Choice(binary, modules, version or "?", "")


def choose(mode: str) -> Choice | str:
    """The router for ``--router mode``; a string saying why when ``nginx`` was asked for and cannot run."""
    if mode == "builtin":
        return builtin("--router builtin")
    found = find_nginx()
    if mode == "nginx":
        return replace(found, forced=True) if found.nginx else f"--router nginx: {found.why}"
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nothing listens on now (bound all at once, then freed)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


class NginxRouter:
    """nginx in the foreground running the router rendered from ``routing`` into ``directory``."""

    def __init__(self, choice: Choice, directory: Path, routing: RoutingConfig) -> None:
        assert choice.binary is not None
        self.choice = choice
        self.directory = directory.resolve()
        self.routing = routing
        self.nginx = RunningNginx(choice.binary, self.directory, (routing.listen, routing.admin_listen))

    @property
    def url(self) -> str:
        return f"http://{self.routing.listen}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.routing.admin_listen}"

    async def start(self) -> None:
        """Render and start; RuntimeError with what nginx said when it does not listen in time."""
        user = "root" if os.geteuid() == 0 else None  # nginx's workers must reach the 0700 directory
        standalone = Standalone(modules=self.choice.modules, user=user, workers=1)
        render(self.routing, self.directory, "the demo's routing: section", standalone)
        await asyncio.to_thread(self.nginx.start, START_TIMEOUT)

    async def requests_by_pool(self) -> Counter[str] | None:
        """The router's own count of requests routed to each pool (its /specguard/metrics)."""
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                session.get(self.admin_url + "/specguard/metrics") as answer,
            ):
                text = await answer.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        counts: Counter[str] = Counter()
        for pool, value in _REQUESTS.findall(text):
            counts[pool] += int(value)
        return counts

    async def stop(self) -> None:
        await asyncio.to_thread(self.nginx.stop)


class PoolWatch:
    """Where the router sends new requests, from the pool each answer names: told of a change once,
    by the answers of requests started after every one seen so far (an answer to a request sent
    before the flag moved still comes from the old pool, and says nothing new)."""

    def __init__(self, first: str, on_change: Callable[[str], None]) -> None:
        self.pool = first
        self.latest = float("-inf")
        self.on_change = on_change

    def __call__(self, started: float, pool: str) -> None:
        if started < self.latest:
            return
        self.latest = started
        if pool != self.pool:
            self.pool = pool
            self.on_change(pool)
