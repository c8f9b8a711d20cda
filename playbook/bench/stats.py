"""What a run measured: latency distributions, throughput, errors, and the speculative decoding
vLLM counted for exactly that run (its ``/metrics`` before and after)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specguard.playbook.bench.client import Result

QUANTILES = (0.5, 0.9, 0.95, 0.99)
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
DRAFTS = "vllm:spec_decode_num_drafts"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": sum(values) / len(values) if values else None}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = quantile(values, q)
    return out


@dataclass
class SpecCounts:
    accepted: float = 0.0
    draft_tokens: float = 0.0
    drafts: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)
    present: bool = False  # the page exported speculative-decoding counters at all


def spec_counts(page: str) -> SpecCounts:
    """vLLM's speculative-decoding counters on a ``/metrics`` page, summed over engines."""
    counts = SpecCounts()
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if sample.name.endswith("_created"):
                continue
            if name == ACCEPTED:
                counts.accepted += sample.value
            elif name == DRAFT_TOKENS:
                counts.draft_tokens += sample.value
            elif name == DRAFTS:
                counts.drafts += sample.value
            elif name == PER_POSITION and "position" in sample.labels:
                position = int(sample.labels["position"])
                counts.per_position[position] = counts.per_position.get(position, 0.0) + sample.value
            else:
                continue
            counts.present = True
    return counts


def acceptance(before: SpecCounts, after: SpecCounts) -> dict[str, Any] | None:
    """Acceptance over the run: rate (accepted / draft tokens), mean acceptance length (1 +
    accepted / drafts, the bonus token included) and per position (accepted there / drafts).
    None when the server does no speculative decoding; a server restarted in between (counters
    went back) says so."""
    if not after.present:
        return None
    drafts = after.drafts - before.drafts
    drafted = after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    if drafts < 0 or drafted < 0 or accepted < 0:
        return {"error": "the server's counters went back during the run (it restarted)"}
    if drafts == 0 or drafted == 0:
        return {"error": "no drafts during the run", "drafts": 0}
    return {
        "rate": accepted / drafted,
        "mean_acceptance_length": 1 + accepted / drafts,
        "per_position": [
            (after.per_position.get(i, 0.0) - before.per_position.get(i, 0.0)) / drafts
            for i in sorted(after.per_position)
        ],
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
    }


# Two chunks of one stream closer than this were not two engine steps: a decode step of any model on
# any hardware takes longer (the tiny Llama on 2 CPU cores: about 2 ms; a GPU's, several). They came
# in one burst: the server's front end, or the client, was held up and passed on several steps at once.
BURST_GAP = 0.0002
# A run with a larger share of such gaps does not time engine steps by its chunks: its ITL and TPOT
# are the bursts', not the engine's.
BURSTY_SHARE = 0.1


def burst_share(results: Sequence[Result]) -> float | None:
    """The share of the gaps between chunks, over the answered requests, shorter than BURST_GAP."""
    gaps = [gap for r in results if r.ok for gap in r.gaps]
    return sum(gap < BURST_GAP for gap in gaps) / len(gaps) if gaps else None


def summarize(results: Sequence[Result], seconds: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [t for r in ok if (t := r.tpot) is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    itl = [gap for r in ok for gap in r.gaps]
    # Token-weighted: a chunk that brought n tokens after a gap counts as n tokens each gap / n apart.
    per_token = [
        gap / n for r in ok for gap, n in zip(r.gaps, r.gap_tokens, strict=True) if n > 0 for _ in range(n)
    ]
    output = sum(r.output_tokens for r in ok)
    errors = Counter(r.error_kind for r in results if not r.ok)
    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": dict(sorted(errors.items())),
        "error_examples": {kind: next(r.error for r in results if r.error_kind == kind) for kind in errors},
        "seconds": seconds,
        "request_throughput": len(ok) / seconds if seconds > 0 else None,
        "output_throughput": output / seconds if seconds > 0 else None,
        "output_tokens": output,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "ttft": distribution(ttft),
        "tpot": distribution(tpot),
        "itl": distribution(itl),
        "itl_per_token": distribution(per_token),
        "e2e": distribution(e2e),
        "tokens_per_chunk": (sum(sum(r.gap_tokens) for r in ok) / len(itl)) if itl else None,
    }


def client_figures(results: Sequence[Result], seconds: float) -> dict[str, float]:
    """The run's figures as its client timed them, named as the baseline's ``client`` figures
    (the catalog's names where the quantity is the same): every answered request together."""
    ok = [r for r in results if r.ok]
    e2e = distribution([r.e2e for r in ok if r.e2e is not None])
    ttft = distribution([r.ttft for r in ok if r.ttft is not None])
    itl = distribution([gap for r in ok for gap in r.gaps])
    tpot = distribution([t for r in ok if (t := r.tpot) is not None])
    figures = {
        "e2e_latency_p50": e2e["p50"],
        "e2e_latency_p95": e2e["p95"],
        "e2e_latency_p99": e2e["p99"],
        "e2e_latency_mean": e2e["mean"],
        "ttft_p95": ttft["p95"],
        "itl_p50": itl["p50"],
        "itl_p95": itl["p95"],
        "tpot_p50": tpot["p50"],
        "tpot_p95": tpot["p95"],
        "tpot_mean": tpot["mean"],
        "output_throughput": sum(r.output_tokens for r in ok) / seconds if ok and seconds > 0 else None,
    }
    return {name: value for name, value in figures.items() if value is not None}
