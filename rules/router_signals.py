"""The router's signals: what specguard's nginx router counts per traffic class and pool.

The router (``specguard routing``) sends each OpenAI request to a pool of vLLM servers by its
*class* (conditions on the request body; ``default``, ``malformed`` and ``other`` are its own) and
counts it on its admin ``/specguard/metrics``, a page that holds no vLLM metric. Added to the scrape
targets (or scraped by Prometheus), it gives these signals, one series per class and pool: how much
traffic each class is and how long the router saw its requests take (nginx's ``$request_time``, from
the request's first byte to the response's last: a streamed request's whole generation).

None of them needs speculation: a class sent to the standard pool is counted as one sent to the
speculative pool. The server's acceptance is not per class (vLLM counts drafts server-wide), so the
report shows a pool's acceptance beside the classes that went to it, never per class.
"""

from __future__ import annotations

from specguard.rules.signal_model import Kind, Metric, Signal

_SINCE = ("specguard's router (routing: in the config)",)

ROUTE_REQUESTS = Metric(("specguard_route_requests_total",), _SINCE, "counter")
ROUTE_DURATION = Metric(("specguard_route_request_duration_seconds",), _SINCE, "histogram")
ROUTE_MALFORMED = Metric(("specguard_route_malformed_total",), _SINCE, "counter")

# The router's duration buckets (upper bounds, +Inf aside), as its page exposes them.
ROUTE_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# Labels of the router's series: the class a request matched and the pool it went to.
CLASS, POOL, REASON = "class", "pool", "reason"


def _latency(name: str, q: float) -> Signal:
    return Signal(
        name=name,
        description=f"Request duration the router saw, per class and pool, {round(q * 100)}th "
        "percentile over the window",
        unit="seconds",
        kind=Kind.QUANTILE,
        metric=ROUTE_DURATION,
        quantile=q,
        intrinsic_labels=(CLASS, POOL),
        notes=("nginx's $request_time: first byte of the request to last byte of the response",),
    )


ROUTER_SIGNALS: tuple[Signal, ...] = (
    Signal(
        name="routed_request_rate",
        description="Requests the router sent on per second, per traffic class and pool",
        unit="per_second",
        kind=Kind.RATE,
        metric=ROUTE_REQUESTS,
        intrinsic_labels=(CLASS, POOL),
        notes=("from the router's /specguard/metrics, a scrape target of its own",),
    ),
    _latency("routed_latency_p50", 0.5),
    _latency("routed_latency_p95", 0.95),
    Signal(
        name="routed_malformed_rate",
        description="Request bodies per second the router could not classify, per reason",
        unit="per_second",
        kind=Kind.RATE,
        metric=ROUTE_MALFORMED,
        intrinsic_labels=(REASON,),
        notes=("reasons: json, not_object, field_type, unreadable_body; sent to the default pool",),
    ),
)
