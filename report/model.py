"""The report's data: one JSON document, which the Markdown and HTML renderings and the charts read.

Times are ISO 8601 in UTC; durations are seconds; ratios are 0-1; ``null`` means no data. The
shape (version 1)::

    {
      "specguard_report": 1,
      "generated_at": "2026-12-07T08:00:00Z",
      "host": "gpu-07",
      "period": {"from": "...", "to": "...", "seconds": 604800},
      "previous_period": {"from": "...", "to": "..."},
      "series": [                                   # one per (instance, model)
        {
          "instance": "10.0.0.7:8000", "model": "llama-70b",
          "k": 5,                                   # positions vLLM counted at the period's end
          "k_previous": 5,                          # the same, at the end of the period before
          "k_share": null,                          # or {"3": 0.4, "5": 0.6}: drafts by k, when k changed
          "draft_cost": 0.05,                       # c, from the baseline file (null: unknown)
          "draft_cost_source": "baseline: method eagle3",
          "headline": {                             # the week, the week before, relative change
            "acceptance_rate": {"value": 0.62, "previous": 0.65, "change": -0.046}, ...
          },                                        # names: HEADLINE below, and "firings": the
                                                    # rules' firings on this server and model
          "per_position": [0.81, 0.62, ...],        # vLLM's p_i (unconditional) over the drafts that
                                                    # had a position i, position 0 first
          "by_day": [{"day": "2026-11-30", "acceptance_rate": 0.6, "mean_acceptance_length": 3.1,
                      "estimated_speedup": 2.4, "drafts": 120000}, ...],
          "by_hour_of_day": [{"hour": 0, ...same fields...}, ...],   # UTC hours with data
          "hourly": [{"at": "2026-11-30T00:00:00Z", "acceptance_rate": 0.6,
                      "mean_acceptance_length": 3.1, "drafts": 5000}, ...],  # the week, hour by hour
          "latency": [{"signal": "ttft_p95", "value": 0.21, "baseline": 0.18,
                       "ratio": 1.17}, ...],        # every latency headline with its baseline
        }
      ],
      "rules": [{"rule": "acceptance_fallback", "severity": "critical", "fired": 2,
                 "fired_previous": 0, "resolved": 2, "median_time_to_act": 1.2,
                 "firings": [{"at": "...", "since": "...", "series": "...", "value": 0.31,
                              "message": "what the firing said", "resolved_at": "...",
                              "resolved_message": "what the resolution said", "time_to_act": 1.2}]}],
      "fallbacks": {"count": 1, "seconds": 5400.0, "previous": {"count": 0, "seconds": 0.0},
                    "spans": [{"action": "fallback", "engaged": "...", "restored": "...",
                               "seconds": 5400.0}]},
      "restarts": [{"at": "...", "action": "fewer_tokens", "status": "ok",
                    "detail": "...", "k_from": 5, "k_to": 3}],
      "silences": [{"rule": "...", "starts": "...", "ends": "...", "reason": "...",
                    "author": "..."}],
      "recommendations": [{"kind": "num_speculative_tokens" | "speculation_lost" | "draft_degrading",
                           "instance": "...", "model": "...", "title": "one line",
                           "reasoning": ["line", ...], "data": {...}}],
      "charts": {"available": true, "missing": null},  # or false and what to install
      "traffic": null | {                           # the router's series (report/traffic.py)
        "routers": ["127.0.0.1:8081"], "requests": 120000,
        "classes": [{"class": "short", "pool": "standard", "requests": 30000, "share": 0.25,
                     "latency_p50": 0.4, "latency_p95": 1.2, "latency_mean": 0.5,
                     "acceptance_rate": null}, ...],   # the pool's, server-wide (null: unknown
                                                       # servers, or no speculation)
        "pools": {"speculative": {"servers": ["127.0.0.1:8000"], "acceptance_rate": 0.62,
                                  "known": true}, ...},
        "malformed": {"json": 12}
      }
    }
"""

from __future__ import annotations

from typing import Any

VERSION = 1

Report = dict[str, Any]

LATENCY: tuple[str, ...] = (
    "ttft_p50",
    "ttft_p95",
    "itl_p50",
    "itl_p95",
    "e2e_latency_p50",
    "e2e_latency_p95",
)

# The figures each series reports for the period, for the one before, and their relative change.
HEADLINE: tuple[str, ...] = (
    "acceptance_rate",
    "mean_acceptance_length",
    "estimated_speedup",
    *LATENCY,
    "generation_throughput",
    "request_rate",
    "kv_cache_usage_mean",
    "kv_cache_usage_max",
    "preemptions",
    "drafts",
)


def change(value: float | None, previous: float | None) -> float | None:
    """The relative change from ``previous`` to ``value``, or None when either is missing or 0."""
    if value is None or previous is None or previous == 0:
        return None
    return (value - previous) / abs(previous)


def headline(value: float | None, previous: float | None) -> dict[str, float | None]:
    return {"value": value, "previous": previous, "change": change(value, previous)}
