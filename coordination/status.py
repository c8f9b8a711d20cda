"""What ``specguard fleet status`` shows: for each semaphore, its limit now, who holds its slots,
since when, under which token, how long their leases have left and for which incident; the hosts
registered; the restarts' budget used."""

from __future__ import annotations

from typing import Any

from specguard.coordination.base import FALLBACK, RESTARTS, Coordinator, limit_of
from specguard.coordination.config import CoordinationConfig


def shown_limit(limit: int | float) -> str:
    return str(limit) if isinstance(limit, int) else f"{limit * 100:g}%"


async def gather(coordinator: Coordinator, config: CoordinationConfig, now: float) -> dict[str, Any]:
    """The fleet as the store holds it now (raises ``Unavailable`` when it cannot be asked)."""
    hosts = await coordinator.hosts()
    semaphores: list[dict[str, Any]] = []
    wanted: list[tuple[str, int | float | None, str]] = [
        (RESTARTS, config.max_concurrent_restarts, "max_concurrent_restarts"),
        (FALLBACK, config.max_in_fallback, "max_in_fallback"),
    ]
    for semaphore, spec, key in wanted:
        holders = await coordinator.holders(semaphore)
        if spec is None and not holders:
            continue
        entry: dict[str, Any] = {
            "semaphore": semaphore,
            "configured": None if spec is None else f"{key}: {shown_limit(spec)}",
            "limit": None if spec is None else limit_of(spec, max(1, len(hosts))),
            "holders": [
                {
                    "owner": h.owner,
                    "token": h.token,
                    "since": h.since,
                    "held_for": max(0.0, now - h.since),
                    "lease_left": max(0.0, h.expires - now),
                    "incident": h.incident,
                }
                for h in holders
            ],
        }
        if semaphore == RESTARTS and config.restarts_per_hour is not None:
            entry["budget"] = {
                "used": await coordinator.budget_used(semaphore, 3600.0),
                "limit": config.restarts_per_hour,
                "window": "1h",
            }
        semaphores.append(entry)
    return {
        "store": config.store,
        "url": config.url,
        "prefix": config.prefix,
        "hosts": list(hosts),
        "semaphores": semaphores,
    }
