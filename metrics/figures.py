"""A window's figures from history minutes: the same arithmetic the catalog's signals do, over sums.

Every figure of a window is computed from the sum of its minutes (``store.history``): acceptance
rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts, position i's rate =
its accepted tokens / the drafts made with a position i (a week with a ladder step holds drafts of
two k), a latency quantile by Prometheus's bucket interpolation over the window's bucket increases,
rates per second of observed time (the minutes history holds), gauges as the average of every
sample in the window (KV-cache usage: the fullest engine at each scrape). A counter history holds no
increase of counted nothing: no accepted token in a week of drafts is an acceptance of 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from specguard.sources.quantiles import bucket_quantile
from specguard.store.history import DRAFTS_BY_K, MINUTE, Components, Span, merge

QUANTILES: dict[str, tuple[str, float]] = {
    "ttft_p50": ("ttft", 0.5),
    "ttft_p95": ("ttft", 0.95),
    "itl_p50": ("itl", 0.5),
    "itl_p95": ("itl", 0.95),
    "e2e_latency_p50": ("e2e", 0.5),
    "e2e_latency_p95": ("e2e", 0.95),
}


def total(spans: Iterable[Span]) -> tuple[Components, int]:
    """The sum of ``spans`` and how many minutes they hold."""
    parts: Components = {}
    count = 0
    for span in spans:
        merge(parts, span.parts)
        count += span.minutes
    return parts, count


def drafts_by_k(parts: Mapping[str, float]) -> dict[int, float]:
    """The window's drafts by the k they were made with (empty for history that did not count it)."""
    return {
        int(key[len(DRAFTS_BY_K) :]): value
        for key, value in parts.items()
        if key.startswith(DRAFTS_BY_K) and key[len(DRAFTS_BY_K) :].isdigit() and value > 0
    }


def positions(parts: Mapping[str, float]) -> int:
    """How many draft positions the window counted (vLLM's num_speculative_tokens; the most of them
    when k changed inside the window)."""
    by_k = drafts_by_k(parts)
    if by_k:
        return max(by_k)
    return sum(1 for key in parts if key.startswith("pos:"))


def per_position(parts: Mapping[str, float]) -> list[float]:
    """p_i for each position: drafts whose tokens 0..i were all accepted / drafts that had a
    position i. A position that accepted nothing has no increase in history, and is 0."""
    drafts = parts.get("drafts", 0.0)
    if drafts <= 0:
        return []
    by_k = drafts_by_k(parts)
    unknown = max(0.0, drafts - sum(by_k.values()))  # history written before drafts were kept by k
    out = []
    for i in range(positions(parts)):
        made = unknown + sum(count for k, count in by_k.items() if k > i)
        out.append(parts.get(f"pos:{i}", 0.0) / made)
    return out


def quantile(parts: Mapping[str, float], histogram: str, q: float) -> float | None:
    prefix = f"{histogram}:le="
    buckets = [(float(key[len(prefix) :]), value) for key, value in parts.items() if key.startswith(prefix)]
    value = bucket_quantile(q, buckets)
    return None if math.isnan(value) else value


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def speedup(mean_acceptance_length: float | None, k: float | None, draft_cost: float | None) -> float | None:
    """Leviathan et al.'s Theorem 3.8 with the measured acceptance length: MAL / (1 + k c)."""
    if mean_acceptance_length is None or k is None or draft_cost is None:
        return None
    return mean_acceptance_length / (1 + k * draft_cost)


def drafted_per_step(parts: Mapping[str, float]) -> float | None:
    """Draft tokens per draft: k, or the drafts' mean k when k changed inside the window. The
    speedup MAL / (1 + k c) is then exact for the mixture too: the window's tokens, drafts x MAL,
    over its cost in target steps, the sum over drafts of 1 + k c."""
    drafts, tokens = parts.get("drafts", 0.0), parts.get("draft_tokens")
    return tokens / drafts if tokens is not None and drafts > 0 else None


def figures(parts: Mapping[str, float], minutes: int, draft_cost: float | None = None) -> dict[str, Any]:
    """Every headline figure of a window whose components sum to ``parts`` over ``minutes``."""
    seconds = minutes * MINUTE
    drafts = parts.get("drafts", 0.0)
    accepted = parts.get("accepted", 0.0)  # none in history: none accepted
    mal = 1 + accepted / drafts if drafts > 0 else None
    out: dict[str, Any] = {
        "acceptance_rate": _ratio(accepted, parts.get("draft_tokens")),
        "mean_acceptance_length": mal,
        "estimated_speedup": speedup(mal, drafted_per_step(parts), draft_cost),
        "generation_throughput": _ratio(parts.get("generation_tokens", 0.0), seconds),
        "request_rate": _ratio(parts.get("requests", 0.0), seconds),
        "kv_cache_usage_mean": _ratio(parts.get("kv:sum"), parts.get("kv:n")),
        "kv_cache_usage_max": parts.get("max:kv"),
        "preemptions": parts.get("preemptions", 0.0) if minutes else None,
        "drafts": drafts if minutes else None,
    }
    for name, (histogram, q) in QUANTILES.items():
        out[name] = quantile(parts, histogram, q)
    return out
