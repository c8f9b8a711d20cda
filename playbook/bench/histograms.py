"""What vLLM's own ``/metrics`` says of a run: its histograms and counters read before and after each
phase, and the figures computed from them exactly as the rules compute theirs.

A rule's ``e2e_latency_p95`` is ``histogram_quantile`` over the increases of vLLM's buckets,
interpolated inside a bucket; vLLM's e2e buckets are 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5... s, so a
run whose requests all took 0.5-0.6 s reads 0.78 s there, while a client that timed them finds
0.6 s. A baseline must hold what the rules will compute, so the figures here go through the scrape
source's own code (``signal_over``) on the phase's two samples; the client's figures stay beside
them. Phases are pooled as counts: each phase's samples are stamped one second apart, so that every
rate is the phase's increase, and the quantile and ratio of the summed increases are those of one
window that held all the phases' requests (neither depends on the scale).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from specguard.rules.signals import CATALOG, E2E_LATENCY_COUNT
from specguard.sources.base import Series
from specguard.sources.windows import signal_over
from specguard.store.exposition import Snapshot, parse_exposition

# The signals a baseline holds, computed from the server's histograms as the rules compute them.
HISTOGRAM_SIGNALS = (
    "e2e_latency_p50", "e2e_latency_p95", "e2e_latency_p99", "e2e_latency_mean", "ttft_p95",
    "itl_p50", "itl_p95", "tpot_p50", "tpot_p95", "tpot_mean",
)  # fmt: skip
THROUGHPUT = "generation_throughput"


@dataclass(frozen=True)
class Reading:
    """One read of a server's ``/metrics``: when (Unix time), the page, and the catalog's samples."""

    at: float
    text: str
    snapshot: Snapshot


def reading(text: str, at: float | None = None) -> Reading | None:
    """A page as a reading; None when it is not Prometheus text (not a vLLM ``/metrics``)."""
    try:
        snapshot = parse_exposition(text)
    except ValueError:
        return None
    return Reading(time.time() if at is None else at, text, snapshot)


Span = tuple[Reading, Reading]  # a phase's readings, before and after


def server_figures(model: str, spans: Sequence[Span]) -> dict[str, float]:
    """The baseline's signals over ``spans`` pooled, for ``model``: every histogram figure the
    server's page has data for, and the generation throughput over the phases' time."""
    if not spans:
        return {}
    pooled = {f"phase {i}": [(0.0, before.snapshot), (1.0, after.snapshot)] for i, (before, after) in enumerate(spans)}  # fmt: skip
    figures: dict[str, float] = {}
    for name in HISTOGRAM_SIGNALS:
        value = _for_model(signal_over(CATALOG[name], pooled, ("model_name",)).series, model)
        if value is not None:
            figures[name] = value
    tokens, seconds = 0.0, 0.0
    for i, (before, after) in enumerate(spans):
        timed = {f"phase {i}": [(before.at, before.snapshot), (after.at, after.snapshot)]}
        rate = _for_model(signal_over(CATALOG[THROUGHPUT], timed, ("model_name",)).series, model)
        if rate is not None:
            tokens += rate * (after.at - before.at)
            seconds += after.at - before.at
    if seconds > 0:
        figures[THROUGHPUT] = tokens / seconds
    return figures


def requests_counted(model: str, span: Span) -> float | None:
    """How many requests the server's e2e histogram counted between the two readings, for
    ``model``: the benchmark's own, and any other client's. None when the page has no such
    histogram."""
    name = E2E_LATENCY_COUNT.names[0]
    before, after = span
    if name not in after.snapshot:
        return None

    def total(reading: Reading) -> float:
        return sum(
            v for labels, v in reading.snapshot.get(name, {}).items() if ("model_name", model) in labels
        )

    first, last = total(before), total(after)
    return last - first if last >= first else last  # a restart in between: counted from 0


def _for_model(series: Sequence[Series], model: str) -> float | None:
    for item in series:
        if item.labels.get("model_name") == model and math.isfinite(item.value):
            return item.value
    return None
