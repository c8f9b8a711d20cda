"""What the running daemon says of itself, read from what its parts share: its health (/healthz),
its status (/api/status, ``specguard status`` and the page, with what the store holds), its rules'
rows, and the one line of systemd's STATUS=. The rows and the line are made by ``daemon.status``."""

from __future__ import annotations

from typing import Any

from specguard import __version__
from specguard.daemon import overview as overview_of
from specguard.daemon import status as views
from specguard.daemon.shared import Shared


def health(shared: Shared) -> tuple[bool, dict[str, Any]]:
    healthy, body = views.health(
        shared.last_round_of, shared.started_at, shared.clock(), len(shared.loaded.enabled_rules())
    )
    if shared.store_error is not None:
        body["status"] = "store_failing"
        body["reason"] = "; ".join(r for r in (body.get("reason"), shared.store_error) if r)
        return False, body
    return healthy, body


def warming_up(shared: Shared) -> list[str]:
    warming: Any = getattr(shared.source, "warming_up", None)
    return sorted(warming()) if warming is not None else []


def status(shared: Shared) -> dict[str, Any]:
    targets: Any = getattr(shared.source, "target_health", None)
    return {
        "version": __version__,
        "source": shared.loaded.config.sources.kind,
        "sources": {
            "warming_up": warming_up(shared),
            "targets": targets() if targets is not None else [],
        },
        "store": {"path": str(shared.store.path), "error": shared.store_error},
        "webhook": {
            "path": shared.loaded.config.server.webhook_path,
            "authenticated": shared.loaded.webhook_token is not None,
            "watched_alerts": shared.alerts.counts(),  # alerts some rule watches, by status
        },
        "dry_run": shared.loaded.config.dry_run,
        "last_evaluation": shared.last_round,
        "fallbacks": shared.dispatcher.controller.status(),  # each flag: should be, why, trouble
        "waiting": shared.dispatcher.waiting,  # runs deferred or waiting for their time, and why
        "fleet": shared.fleet.status(),  # the coordination store and this host's name in it; None: alone
        "rules": rule_rows(shared),
    }


async def overview(shared: Shared) -> dict[str, Any]:
    """/api/status, ``specguard status`` and the page: ``status()`` and what the store holds."""
    return await overview_of.gather(
        status(shared),
        health(shared),
        shared.store,
        shared.dispatcher.actions,
        shared.clock(),
        shared.started_at,
    )


def rule_rows(shared: Shared) -> list[dict[str, Any]]:
    return views.rule_rows(
        shared.loaded.enabled_rules(),
        shared.states,
        shared.rule_errors,
        shared.rule_verdicts,
        shared.loaded.config.interval,
    )


def status_line(shared: Shared) -> str:
    targets: Any = getattr(shared.source, "target_health", None)
    return views.status_line(rule_rows(shared), targets() if targets is not None else [], shared.store_error)


def tell_status(shared: Shared) -> None:
    """systemd's STATUS=, when it says something new."""
    line = status_line(shared)
    if line != shared.status_told:
        shared.status_told = line
        shared.notifier.status(line)
