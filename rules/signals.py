"""The signal catalog: the only place that spells metric names (vLLM's, and specguard's router's).

A signal is a quantity an operator writes rules about (``acceptance_rate``, ``e2e_latency_p95``...).
Each one says which vLLM metrics it is computed from, for every vLLM version specguard supports, and
how: a ratio of counter rates, a histogram quantile, a gauge average or a counter rate. Both sources
compute the same thing from this description: the Prometheus source as PromQL, the scrape source from
its own ring of ``/metrics`` samples.

Across the series a group holds (vLLM's data-parallel engines, or several servers when a rule groups
by model only), rates and counts add up; a gauge is averaged over the window per series and then
combined the way that keeps trouble visible: KV-cache usage takes the fullest engine (an average
would hide one saturated engine), queue lengths add up. Each signal states its domain: a value
outside it (a negative rate, a ratio above 1, NaN) cannot come from a healthy vLLM and is reported
as an error for that series, never as a breach.

Where vLLM renamed a metric, a ``Metric`` lists the names newest first; the first one present wins.

The router's own counters (``specguard routing``: requests, latency and malformed bodies per traffic
class and pool, on its admin ``/specguard/metrics``) are signals too, in ``rules/router_signals.py``:
they need no speculation, and a rule or a report reads them as it reads vLLM's.
"""

from __future__ import annotations

import math

from specguard.rules.router_signals import ROUTER_SIGNALS
from specguard.rules.signal_model import Kind as Kind
from specguard.rules.signal_model import Metric as Metric
from specguard.rules.signal_model import Signal as Signal

# --- the vLLM metrics (vLLM 0.9 - 0.34, V1 engine; see the reference on renames) -------------------

SPEC_ACCEPTED = Metric(
    ("vllm:spec_decode_num_accepted_tokens_total",), ("0.8.3+ (V1; same name in V0)",), "counter"
)
SPEC_DRAFT_TOKENS = Metric(
    ("vllm:spec_decode_num_draft_tokens_total",), ("0.8.3+ (V1; same name in V0)",), "counter"
)
SPEC_DRAFTS = Metric(("vllm:spec_decode_num_drafts_total",), ("0.8.5+",), "counter")
SPEC_ACCEPTED_PER_POS = Metric(
    ("vllm:spec_decode_num_accepted_tokens_per_pos_total",), ("0.8.5+",), "counter"
)
E2E_LATENCY = Metric(("vllm:e2e_request_latency_seconds",), ("all",), "histogram")
# A histogram's sum and count are counters of their own: their rates give the exact mean, where a
# quantile is interpolated inside a bucket (vLLM's e2e buckets are 0.5, 0.8, 1, 1.5... seconds).
E2E_LATENCY_SUM = Metric(("vllm:e2e_request_latency_seconds_sum",), ("all",), "counter")
E2E_LATENCY_COUNT = Metric(("vllm:e2e_request_latency_seconds_count",), ("all",), "counter")
# Each request's mean time per output token after the first: (last token - first token) / (tokens - 1).
REQUEST_TPOT = Metric(("vllm:request_time_per_output_token_seconds",), ("0.11.0+",), "histogram")
REQUEST_TPOT_SUM = Metric(("vllm:request_time_per_output_token_seconds_sum",), ("0.11.0+",), "counter")
REQUEST_TPOT_COUNT = Metric(("vllm:request_time_per_output_token_seconds_count",), ("0.11.0+",), "counter")
TTFT = Metric(("vllm:time_to_first_token_seconds",), ("all",), "histogram")
ITL = Metric(
    ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ("0.10.2+", "up to 0.14 (deprecated 0.11, hidden 0.12-0.14)"),
    "histogram",
)
KV_CACHE = Metric(
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("0.9.2+", "up to 0.11 (removed 0.12)"),
    "gauge",
)
PREEMPTIONS = Metric(("vllm:num_preemptions_total",), ("all",), "counter")
RUNNING = Metric(("vllm:num_requests_running",), ("all",), "gauge")
WAITING = Metric(("vllm:num_requests_waiting",), ("all",), "gauge")
GENERATION_TOKENS = Metric(("vllm:generation_tokens_total",), ("all",), "counter")
REQUEST_SUCCESS = Metric(("vllm:request_success_total",), ("all",), "counter")


def _quantile(name: str, metric: Metric, q: float, what: str) -> Signal:
    return Signal(
        name=name,
        description=f"{what}, {round(q * 100)}th percentile over the window",
        unit="seconds",
        kind=Kind.QUANTILE,
        metric=metric,
        quantile=q,
    )


def _mean(name: str, total: Metric, count: Metric, what: str) -> Signal:
    return Signal(
        name=name,
        description=f"{what}, mean over the window (the histogram's sum / count)",
        unit="seconds",
        kind=Kind.RATIO,
        metric=total,
        denominator=count,
        notes=("exact: no interpolation inside a bucket, so it moves with a slowdown a quantile cannot see",),
    )


_SIGNALS: tuple[Signal, ...] = (
    Signal(
        name="acceptance_rate",
        description="Accepted draft tokens / proposed draft tokens (bonus token excluded)",
        unit="ratio",
        kind=Kind.RATIO,
        metric=SPEC_ACCEPTED,
        denominator=SPEC_DRAFT_TOKENS,
        requires_speculation=True,
        notes=("vLLM's draft acceptance rate: below the paper's per-token alpha when k > 1",),
        domain=(0.0, 1.0),
    ),
    Signal(
        name="token_acceptance",
        description="Per-token acceptance of the chain model: accepted / (accepted + drafts that ended "
        "in a rejection); the same at every k",
        unit="ratio",
        kind=Kind.CHAIN,
        metric=SPEC_ACCEPTED,
        denominator=SPEC_DRAFTS,
        per_position=SPEC_ACCEPTED_PER_POS,
        draft_tokens=SPEC_DRAFT_TOKENS,
        requires_speculation=True,
        domain=(0.0, 1.0),
        notes=(
            "alpha-hat = S / (S + F): S accepted tokens, F drafts minus the last position's count; "
            "vLLM's acceptance_rate is alpha(1 - alpha^k) / (k (1 - alpha)) of it",
            "drafts shorter than k (ngram without a long match) bias it: such a series is an error",
        ),
    ),
    Signal(
        name="mean_acceptance_length",
        description="Tokens produced per draft, bonus token included (1 = nothing accepted)",
        unit="tokens",
        kind=Kind.RATIO,
        metric=SPEC_ACCEPTED,
        denominator=SPEC_DRAFTS,
        offset=1.0,
        requires_speculation=True,
        domain=(1.0, math.inf),
    ),
    Signal(
        name="acceptance_by_position",
        description="Share of drafts whose tokens 0..i were all accepted, per draft position i",
        unit="ratio",
        kind=Kind.PER_POSITION,
        metric=SPEC_ACCEPTED_PER_POS,
        denominator=SPEC_DRAFTS,
        intrinsic_labels=("position",),
        requires_speculation=True,
        domain=(0.0, 1.0),
        notes=("a rule that groups without `position` gets the sum over the positions it matches",),
    ),
    Signal(
        name="num_speculative_tokens",
        description="Draft positions vLLM counts (num_speculative_tokens), the most of any engine",
        unit="tokens",
        kind=Kind.POSITIONS,
        metric=SPEC_ACCEPTED_PER_POS,
        requires_speculation=True,
        domain=(1.0, math.inf),
        notes=("read from the per-position series vLLM creates at startup, one per position",),
    ),
    Signal(
        name="estimated_speedup",
        description="Mean acceptance length / (1 + k c): decoding speed against no speculation",
        unit="ratio",
        kind=Kind.SPEEDUP,
        metric=SPEC_ACCEPTED,
        inputs=("mean_acceptance_length", "num_speculative_tokens"),
        requires_speculation=True,
        domain=(0.0, math.inf),
        notes=(
            "Leviathan et al.'s Theorem 3.8 with vLLM's measured acceptance length; c (draft step / "
            "target step) comes from the baseline file, per model",
        ),
    ),
    _quantile("e2e_latency_p50", E2E_LATENCY, 0.5, "End-to-end request latency"),
    _quantile("e2e_latency_p95", E2E_LATENCY, 0.95, "End-to-end request latency"),
    _quantile("e2e_latency_p99", E2E_LATENCY, 0.99, "End-to-end request latency"),
    _mean("e2e_latency_mean", E2E_LATENCY_SUM, E2E_LATENCY_COUNT, "End-to-end request latency"),
    _quantile("ttft_p95", TTFT, 0.95, "Time to first token"),
    _quantile("itl_p50", ITL, 0.5, "Inter-token latency (one interval may carry several tokens)"),
    _quantile("itl_p95", ITL, 0.95, "Inter-token latency (one interval may carry several tokens)"),
    _quantile("tpot_p50", REQUEST_TPOT, 0.5, "Time per output token of each request"),
    _quantile("tpot_p95", REQUEST_TPOT, 0.95, "Time per output token of each request"),
    _mean("tpot_mean", REQUEST_TPOT_SUM, REQUEST_TPOT_COUNT, "Time per output token of each request"),
    Signal(
        name="kv_cache_usage",
        description="KV-cache usage, fraction 0-1, averaged over the window; the fullest engine",
        unit="ratio",
        kind=Kind.GAUGE,
        metric=KV_CACHE,
        combine="max",
        domain=(0.0, 1.0),
    ),
    Signal(
        name="preemption_rate",
        description="Preemptions per second",
        unit="per_second",
        kind=Kind.RATE,
        metric=PREEMPTIONS,
    ),
    Signal(
        name="running_requests",
        description="Requests in the running batch, averaged over the window, summed over engines",
        unit="requests",
        kind=Kind.GAUGE,
        metric=RUNNING,
        combine="sum",
    ),
    Signal(
        name="waiting_requests",
        description="Requests waiting to be scheduled, averaged over the window, summed over engines",
        unit="requests",
        kind=Kind.GAUGE,
        metric=WAITING,
        combine="sum",
    ),
    Signal(
        name="generation_throughput",
        description="Generated tokens per second",
        unit="tokens_per_second",
        kind=Kind.RATE,
        metric=GENERATION_TOKENS,
    ),
    Signal(
        name="request_rate",
        description="Finished requests per second (every finish reason)",
        unit="per_second",
        kind=Kind.RATE,
        metric=REQUEST_SUCCESS,
    ),
    *ROUTER_SIGNALS,
)

CATALOG: dict[str, Signal] = {signal.name: signal for signal in _SIGNALS}

# Labels every signal keeps unless a rule says otherwise: one series per vLLM server and model.
DEFAULT_GROUP_BY: tuple[str, ...] = ("instance", "model_name")


def default_group_by(signal: Signal) -> tuple[str, ...]:
    """The labels a rule on ``signal`` keeps when it gives no ``group_by``."""
    return tuple(signal.groups(DEFAULT_GROUP_BY))


def get_signal(name: str) -> Signal:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise KeyError(f"unknown signal {name!r}; known signals: {known}") from None


def metric_names() -> set[str]:
    """Every exposition family name the catalog reads (for filtering a scrape)."""
    names: set[str] = set()
    for signal in _SIGNALS:
        for metric in (signal.metric, signal.denominator, signal.per_position, signal.draft_tokens):
            if metric is not None:
                names.update(metric.names)
    return names
