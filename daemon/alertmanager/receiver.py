"""``POST /alertmanager``: Alertmanager's webhook, answered by its retry contract.

Alertmanager retries a 5xx and a failed connection, and drops every 4xx for good. So:

- 200 once the delivery is durably stored (a repeat of what is stored is a 200 too, stored once);
- 401 for a missing or wrong bearer token (compared in constant time);
- 415 for a body not declared JSON or sent encoded, 413 over the size limit, 400 for anything not
  a version 4 payload, each with the reason in the body and in the log;
- 503 when the store cannot take the delivery, so that Alertmanager sends it again.

Nothing a client sends produces a 500 or a traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from specguard.common.secrets import bearer_matches
from specguard.daemon.alertmanager.inbox import Stored
from specguard.daemon.alertmanager.payload import BadPayload, Message, parse
from specguard.metrics.registry import DaemonMetrics
from specguard.store.database import StoreError

log = logging.getLogger("specguard.webhook")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Sink(Protocol):
    """Where a valid delivery goes: stored, then acted on."""

    async def deliver(self, message: Message, received: float) -> Stored:
        """Store ``message`` (raises StoreError when it cannot) and queue what it triggers."""
        ...


def _reject(
    status: int, outcome: str, reason: str, metrics: DaemonMetrics, peer: str, **headers: str
) -> web.Response:
    """A refusal, logged: Alertmanager drops a 4xx for good, so this log line is all that is left."""
    if status < 500:
        log.warning("webhook from %s refused: %s", peer, reason)
    metrics.webhook_deliveries.labels(outcome).inc()
    return web.json_response({"status": "rejected", "reason": reason}, status=status, headers=headers)


def make_handler(
    sink: Sink, token: Callable[[], str | None], max_body: int, metrics: DaemonMetrics
) -> Handler:
    """The handler. ``token`` gives the expected bearer token (None: no authentication), read at
    each request so that a reload can rotate it."""

    async def receive(request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            return await _receive(request)
        finally:
            metrics.webhook_seconds.observe(time.monotonic() - started)

    async def _receive(request: web.Request) -> web.StreamResponse:
        peer = request.remote or "?"
        secret = token()
        if secret is not None:
            header = request.headers.get("Authorization", "")
            if not bearer_matches(header, secret):
                why = "missing bearer token" if not header else "wrong bearer token"
                return _reject(401, "unauthorized", why, metrics, peer, **{"WWW-Authenticate": "Bearer"})
        if request.content_type != "application/json":
            declared = request.headers.get("Content-Type")
            why = (
                f"Content-Type must be application/json, not {declared!r}"
                if declared
                else "Content-Type is missing: send application/json"
            )
            return _reject(415, "bad_request", why, metrics, peer)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            why = f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed"
            return _reject(415, "bad_request", why, metrics, peer)
        if request.content_length is not None and request.content_length > max_body:
            return _too_large(peer, request.content_length)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(peer, None)
        except (ClientPayloadError, HttpProcessingError) as exc:
            why = f"the body could not be read: {exc}"
            return _reject(400, "bad_request", why, metrics, peer)
        try:
            message = parse(body)
        except BadPayload as exc:
            return _reject(400, "bad_request", str(exc), metrics, peer)
        try:
            stored = await sink.deliver(message, time.time())
        except StoreError as exc:
            log.error("webhook from %s not stored, Alertmanager will retry: %s", peer, exc)
            return _reject(
                503,
                "store_failing",
                f"cannot store the delivery: {exc}",
                metrics,
                peer,
                **{"Retry-After": "5"},
            )
        outcome = "duplicate" if message.alerts and not stored.new else "stored"
        metrics.webhook_deliveries.labels(outcome).inc()
        for alert in message.alerts:
            metrics.webhook_alerts.labels(alert.status.value).inc()
        metrics.webhook_duplicates.inc(stored.duplicates)
        if message.truncated_alerts:
            metrics.webhook_truncated.inc(message.truncated_alerts)
            log.warning(
                "webhook delivery %d for group %s left out %d alerts (Alertmanager's max_alerts)",
                stored.delivery_id,
                message.group_key,
                message.truncated_alerts,
            )
        log.info(
            "webhook delivery %d from %s: %s, group %s: %d alerts, %d new, %d already known",
            stored.delivery_id,
            peer,
            message.status.value,
            message.group_key,
            len(message.alerts),
            len(stored.new),
            stored.duplicates,
            extra={"delivery": stored.delivery_id, "group_key": message.group_key},
        )
        return web.json_response(
            {
                "status": outcome,
                "delivery": stored.delivery_id,
                "alerts": len(message.alerts),
                "new": len(stored.new),
                "duplicates": stored.duplicates,
            }
        )

    def _too_large(peer: str, size: int | None) -> web.Response:
        given = f" ({size} bytes)" if size is not None else ""
        why = f"body over the limit of {max_body} bytes{given}: lower Alertmanager's max_alerts or raise server.webhook_max_body_size"
        return _reject(413, "too_large", why, metrics, peer)

    return receive
