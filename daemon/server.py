"""The daemon's HTTP server: /healthz, /metrics (its own), /api/status."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from daemon import __version__

if TYPE_CHECKING:
    from daemon.runtime import Daemon

DAEMON_KEY: web.AppKey[Daemon] = web.AppKey("daemon")


async def healthz(request: web.Request) -> web.Response:
    """200 while evaluation rounds keep happening; 503 when they have stalled."""
    daemon = request.app[DAEMON_KEY]
    now = time.time()
    allowed = max(3 * daemon.loaded.config.interval, 30.0)
    last = daemon.last_round or daemon.started_at
    healthy = now - last <= allowed
    body = {
        "status": "ok" if healthy else "stalled",
        "version": __version__,
        "last_evaluation": daemon.last_round,
        "rules": len(daemon.loaded.enabled_rules()),
    }
    return web.json_response(body, status=200 if healthy else 503)


async def api_status(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON_KEY]
    body: dict[str, Any] = {
        "version": __version__,
        "source": daemon.loaded.config.sources.kind,
        "dry_run": daemon.loaded.config.dry_run,
        "last_evaluation": daemon.last_round,
        "rules": daemon.status(),
    }
    return web.json_response(body)


def build_app(daemon: Daemon) -> web.Application:
    app = web.Application(client_max_size=1024**2)
    app[DAEMON_KEY] = daemon
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/metrics", make_aiohttp_handler(daemon.metrics.registry))
    return app


async def start_server(daemon: Daemon) -> tuple[web.AppRunner, int]:
    """Start listening; returns the runner (for cleanup) and the bound port."""
    runner = web.AppRunner(build_app(daemon), handle_signals=False, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, daemon.loaded.config.listen, daemon.loaded.config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(
            f"specguard: cannot listen on {daemon.loaded.config.listen}:{daemon.loaded.config.port}: "
            f"{exc.strerror}"
        ) from None
    port = runner.addresses[0][1] if runner.addresses else daemon.loaded.config.port
    return runner, int(port)
