"""The daemon's HTTP server: /healthz, /metrics (its own), /api/status, and the routes the runtime
hands it (the Alertmanager webhook, /api/silences, /api/ladder, the status page at /).

It shows whatever implements :class:`Observed` (the running daemon) and knows nothing else of it,
so the runtime depends on the server and not the other way round.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler


class Observed(Protocol):
    """What the HTTP server shows."""

    @property
    def registry(self) -> CollectorRegistry:
        """The daemon's own metrics."""
        ...

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the daemon is doing its job, and the body that says so."""
        ...

    def status(self) -> dict[str, Any]:
        """Every rule and series, the targets, the flags' plans and the runs that wait (in memory)."""
        ...

    async def overview(self) -> dict[str, Any]:
        """What /api/status returns: ``status()`` with the health, the silences and what the
        actions hold (read from the store)."""
        ...


OBSERVED_KEY: web.AppKey[Observed] = web.AppKey("observed")


async def healthz(request: web.Request) -> web.Response:
    """200 while every rule is evaluated on schedule; 503 with the reason when not."""
    healthy, body = request.app[OBSERVED_KEY].health()
    return web.json_response(body, status=200 if healthy else 503)


async def api_status(request: web.Request) -> web.Response:
    return web.json_response(await request.app[OBSERVED_KEY].overview())


@dataclass(frozen=True)
class Webhook:
    """A POST endpoint served beside the daemon's own (Alertmanager's receiver)."""

    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    max_body: int


def build_app(
    observed: Observed, webhook: Webhook | None = None, routes: Sequence[web.RouteDef] = ()
) -> web.Application:
    # aiohttp answers 413 itself past client_max_size; the webhook's handler says more first
    # when the request declares its length.
    app = web.Application(client_max_size=webhook.max_body if webhook else 1024**2)
    app[OBSERVED_KEY] = observed
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/metrics", make_aiohttp_handler(observed.registry))
    if webhook is not None:
        app.router.add_post(webhook.path, webhook.handler)
    app.router.add_routes(routes)
    return app


# A connection that sends nothing (or nothing more) for this long is closed, requests in progress
# aside: half-open connections cannot pile up.
IDLE_TIMEOUT = 10.0
# Connections served at once. Beyond it the oldest connection is closed to make room for the new
# one, so a flood of idle connections can neither exhaust file descriptors nor lock out /healthz.
MAX_CONNECTIONS = 256


async def start_server(
    observed: Observed,
    listen: str,
    port: int,
    max_connections: int = MAX_CONNECTIONS,
    webhook: Webhook | None = None,
    routes: Sequence[web.RouteDef] = (),
) -> tuple[web.AppRunner, int]:
    """Start listening; returns the runner (for cleanup) and the bound port."""
    runner = web.AppRunner(
        build_app(observed, webhook, routes),
        handle_signals=False,
        access_log=None,
        shutdown_timeout=5.0,
        keepalive_timeout=IDLE_TIMEOUT,  # aiohttp starts this clock when a connection opens, too
        # Nothing specguard serves takes a compressed body (Alertmanager sends none): a body that
        # claims an encoding is refused by the handler, never decoded (and failed) by aiohttp.
        auto_decompress=False,
    )
    await runner.setup()
    _cap_connections(runner, max_connections, observed)
    site = web.TCPSite(runner, listen, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"specguard: cannot listen on {listen}:{port}: {exc.strerror}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, int(bound)


def _cap_connections(runner: web.AppRunner, most: int, observed: Observed) -> None:
    """Close the oldest connections beyond ``most`` as new ones arrive."""
    server = runner.server
    assert server is not None
    made = server.connection_made
    evicted = getattr(observed, "connections_evicted", None)
    held = getattr(observed, "connections_held", None)

    closing: set[Any] = set()  # closed here, and not yet gone from server.connections

    def connection_made(handler: Any, transport: Any) -> None:
        made(handler, transport)
        connections = server.connections  # oldest first
        closing.intersection_update(connections)
        live = [c for c in connections if c not in closing]
        excess = live[: max(0, len(live) - most)]
        for old in excess:
            closing.add(old)
            old.force_close()
            if evicted is not None:
                evicted()
        if held is not None:
            held(len(live) - len(excess))

    server.connection_made = connection_made  # type: ignore[method-assign]
