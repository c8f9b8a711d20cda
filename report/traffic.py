"""The report's traffic by class: what the router counted per traffic class and pool, from history.

The router's page (``rules/router_signals.py``) is a scrape target of its own, so history holds it as
one more series whose components are all the router's (``store/history.py``'s ``route:`` and
``malformed:`` components). Such a series is not a server: it is left out of the per-server
sections and read here, every router's summed. Latency is what the router saw (nginx's
``$request_time``), as Prometheus's ``histogram_quantile`` over the period's bucket increases.

Acceptance is not per class: vLLM counts drafts server-wide. A row shows the acceptance of the pool
its class went to, the pool's servers' accepted / draft tokens over the period, when the report
knows which servers the pool holds (the routing config's ``pools``, as ``host:port``, matched with
history's ``instance``) and they speculated.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from specguard.config.routing import RoutingConfig
from specguard.metrics import figures as fig
from specguard.rules.router_signals import ROUTE_BUCKETS
from specguard.sources.quantiles import bucket_quantile
from specguard.store.history import MALFORMED, ROUTE, Span, route_parts

Pools = Mapping[str, Collection[str]]  # pool -> its servers' instance labels (host:port)


def is_router(spans: Iterable[Span]) -> bool:
    """Whether a history series is a router's: every component of it is one of the router's."""
    keys = {key for span in spans for key in span.parts}
    return bool(keys) and all(key.startswith((ROUTE, MALFORMED)) for key in keys)


def pools_of(routing: RoutingConfig | None) -> dict[str, tuple[str, ...]]:
    """Each pool's servers (``host:port``) from the config's routing section; none without one."""
    if routing is None:
        return {}
    return {name: pool.servers for name, pool in routing.pools.items()}


def traffic(
    history: Mapping[tuple[str, str], list[Span]], pools: Pools | None = None
) -> dict[str, Any] | None:
    """The period's traffic by class and pool, or None when history holds no router series."""
    routers = {key: spans for key, spans in history.items() if is_router(spans)}
    if not routers:
        return None
    parts, _ = fig.total(span for spans in routers.values() for span in spans)
    per: dict[tuple[str, str], dict[str, Any]] = {}
    malformed: dict[str, float] = {}
    for key, value in parts.items():
        if key.startswith(MALFORMED):
            malformed[key[len(MALFORMED) :]] = value
            continue
        parsed = route_parts(key)
        if parsed is None:
            continue
        part, pool, cls = parsed
        entry = per.setdefault((cls, pool), {"n": 0.0, "sum": 0.0, "count": 0.0, "buckets": []})
        if part.startswith("le="):
            entry["buckets"].append((float(part[3:]), value))
        elif part in ("n", "sum", "count"):
            entry[part] += value
    total = sum(entry["n"] for entry in per.values())
    servers = _pool_acceptance(history, routers, pools or {})
    classes = []
    for (cls, pool), entry in sorted(per.items(), key=lambda item: (-item[1]["n"], item[0])):
        classes.append(
            {
                "class": cls,
                "pool": pool,
                "requests": entry["n"],
                "share": entry["n"] / total if total else None,
                "latency_p50": _quantile(0.5, entry["buckets"]),
                "latency_p95": _quantile(0.95, entry["buckets"]),
                "latency_mean": entry["sum"] / entry["count"] if entry["count"] else None,
                "acceptance_rate": (servers.get(pool) or {}).get("acceptance_rate"),
            }
        )
    for pool in sorted({pool for _, pool in per} - set(servers)):
        servers[pool] = {"servers": [], "acceptance_rate": None, "known": False}
    return {
        "routers": sorted(instance for instance, _ in routers),
        "requests": total,
        "classes": classes,
        "pools": dict(sorted(servers.items())),
        "malformed": dict(sorted(malformed.items())),
    }


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's quantile over the period's bucket increases. History keeps no increase of a
    bucket that counted nothing, and those are exactly the buckets below the lowest that did
    (the counts are cumulative): they are put back as 0, so the lowest bucket with requests is
    interpolated from its true lower bound, not from 0."""
    present = {bound for bound, _ in buckets}
    buckets = [*buckets, *((bound, 0.0) for bound in ROUTE_BUCKETS if bound not in present)]
    value = bucket_quantile(q, buckets)
    return None if math.isnan(value) else value


def _pool_acceptance(
    history: Mapping[tuple[str, str], list[Span]], routers: Mapping[tuple[str, str], list[Span]], pools: Pools
) -> dict[str, dict[str, Any]]:
    """Each pool with known servers: them, and their accepted / draft tokens over the period (None
    when they made no draft: a pool without speculation)."""
    out: dict[str, dict[str, Any]] = {}
    for pool, members in pools.items():
        accepted = drafted = 0.0
        for (instance, model), spans in history.items():
            if instance in members and (instance, model) not in routers:
                parts, _ = fig.total(spans)
                accepted += parts.get("accepted", 0.0)
                drafted += parts.get("draft_tokens", 0.0)
        out[pool] = {
            "servers": sorted(members),
            "acceptance_rate": accepted / drafted if drafted > 0 else None,
            "known": True,
        }
    return out
