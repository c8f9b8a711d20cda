"""A real vLLM 0.32.0 /metrics capture, replayed as a busy server: its counters move at every scrape.

Shared by the tests that need a vLLM to watch (Prometheus source, the daemon) without starting one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

CAPTURE = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-metrics-self-draft.prom"
MODEL = "tiny-llama"  # served_model_name in the capture

# What every scrape adds to the capture: 10 drafts of 5 tokens, 30 of them accepted, split by
# draft position (position i counts the drafts whose tokens 0..i were all accepted).
DRAFTS, DRAFT_TOKENS, ACCEPTED = 10, 50, 30
ACCEPTED_BY_POSITION = {"0": 9, "1": 8, "2": 7, "3": 5, "4": 1}
GENERATED, PREEMPTIONS = 40, 1  # tokens generated (1 + accepted per draft) and preemptions
# Latencies (seconds) observed between two scrapes; each bucket grows by those under its ``le``.
OBSERVATIONS = {
    "vllm:e2e_request_latency_seconds": [0.2, 0.2, 0.6, 0.6, 0.6, 0.9, 0.9, 0.9, 0.9, 1.7],
    "vllm:time_to_first_token_seconds": [0.03, 0.05, 0.05, 0.07],
    "vllm:inter_token_latency_seconds": [0.02] * 8 + [0.04, 0.06],
    "vllm:request_time_per_output_token_seconds": [0.008] * 6 + [0.012, 0.02, 0.03, 0.05],
}

SAMPLE = re.compile(r"^([^\s{#]+)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def per_scrape(name: str, labels: Mapping[str, str]) -> float:
    """How much the sample ``name{labels}`` grows at every scrape."""
    counters = {
        "vllm:spec_decode_num_drafts_total": DRAFTS,
        "vllm:spec_decode_num_draft_tokens_total": DRAFT_TOKENS,
        "vllm:spec_decode_num_accepted_tokens_total": ACCEPTED,
        "vllm:generation_tokens_total": GENERATED,
        "vllm:num_preemptions_total": PREEMPTIONS,
    }
    if name in counters:
        return counters[name]
    if name == "vllm:request_success_total":
        return (
            len(OBSERVATIONS["vllm:e2e_request_latency_seconds"])
            if labels["finished_reason"] == "length"
            else 0
        )
    if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
        return ACCEPTED_BY_POSITION[labels["position"]]
    for family, values in OBSERVATIONS.items():
        if name == f"{family}_bucket":
            return sum(value <= float(labels["le"]) for value in values)
        if name == f"{family}_count":
            return len(values)
        if name == f"{family}_sum":
            return sum(values)
    return 0.0


# Gauges of a varying replay: (engine, step) -> value. Engine 1 is saturated while engine 0 is not.
GAUGES = {
    "vllm:kv_cache_usage_perc": lambda engine, step: (
        0.97 - 0.01 * (step % 3) if engine == "1" else 0.1 * (step % 5)
    ),
    "vllm:num_requests_running": lambda engine, step: float(step % 4 + (3 if engine == "1" else 0)),
    "vllm:num_requests_waiting": lambda engine, step: float(step % 3 + (5 if engine == "1" else 0)),
}


class ReplayedVllm:
    """The capture served as a busy vLLM would: its counters move forward at every scrape.

    ``vary``: each scrape adds one more time the usual work than the scrape before (1, 2, 3...), so
    that a rate over a recent, short window is higher than one over a longer window, and the gauges
    change from scrape to scrape (GAUGES).
    ``engines``: with 2, every series exists for a second data-parallel engine too.
    """

    def __init__(self, vary: bool = False, engines: int = 1) -> None:
        lines = CAPTURE.read_text().splitlines()
        if engines == 2:
            lines = [twin for line in lines for twin in _with_engine_one(line)]
        self.lines = lines
        self.vary = vary
        # Start far from zero: rate() extrapolates a counter that starts near zero only down to
        # zero, which would give that one series its own factor and bend the exact ratios.
        self.step = 100
        self.progress = 100  # scrapes' worth of work done so far

    def __call__(self) -> str:
        self.step += 1
        self.progress += self.step - 100 if self.vary else 1
        return "\n".join(self._advance(line) for line in self.lines) + "\n"

    def _advance(self, line: str) -> str:
        sample = SAMPLE.match(line)
        if sample is None:
            return line  # HELP, TYPE
        name, labels, value = sample.group(1), dict(LABEL.findall(sample.group(2) or "")), sample[3]
        if self.vary and name in GAUGES:
            return f"{line[: sample.start(3)]}{GAUGES[name](labels.get('engine', '0'), self.step)!r}"
        grown = float(value) + self.progress * per_scrape(name, labels)
        return f"{line[: sample.start(3)]}{grown!r}"


def _with_engine_one(line: str) -> list[str]:
    if 'engine="0"' in line and not line.startswith("#"):
        return [line, line.replace('engine="0"', 'engine="1"')]
    return [line]


def histogram_quantile(q: float, family: str) -> float:
    """What Prometheus's histogram_quantile gives for one scrape's worth of OBSERVATIONS.

    rate() scales every bucket of a scrape by the same factor, and the quantile does not change
    under scaling, so the bucket deltas are enough. Linear interpolation inside the bucket that
    holds rank q * count; the lowest bucket starts at 0; +Inf falls back to the highest bound.
    """
    bounds = sorted(
        float(labels["le"])
        for line in CAPTURE.read_text().splitlines()
        if (sample := SAMPLE.match(line)) and sample[1] == f"{family}_bucket"
        for labels in [dict(LABEL.findall(sample[2]))]
    )
    counts = [sum(value <= bound for value in OBSERVATIONS[family]) for bound in bounds]
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("the +Inf bucket holds every observation")
