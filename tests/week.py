"""A simulated timeline of vLLM servers, minute by minute, with its ground truth kept aside.

Each minute a server's traffic adds to its counters and histograms (drafts, per-position accepted
tokens under the chain model with the minute's per-token acceptance, requests and their latencies)
and sets its gauges; a scrape at the middle of the minute exposes the cumulative values as vLLM's
``/metrics`` text. What was added each minute is kept in ``truth`` in the generator's own terms, so
a test computes every figure of a report without any of specguard's code.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
HISTOGRAMS = {
    "e2e": ("vllm:e2e_request_latency_seconds", E2E_BUCKETS),
    "ttft": ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
    "itl": ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
}


# The report's week (Nov 30 - Dec 7, 2026) and the week before it, with its known incidents: on
# Tuesday 14:00-15:30 server A's draft collapses (per-token acceptance 0.25); on Thursday
# 13:00-17:00 server B runs with its KV cache full (0.97), preempting and slower; B's draft
# degrades through the week.
DAY = 86400.0
MONDAY = datetime(2026, 11, 30, tzinfo=UTC).timestamp()  # the report's week: Nov 30 - Dec 7
BEFORE = MONDAY - 7 * DAY
COLLAPSE = (MONDAY + DAY + 14 * 3600, MONDAY + DAY + 15.5 * 3600)  # Tuesday afternoon
PRESSURE = (MONDAY + 3 * DAY + 13 * 3600, MONDAY + 3 * DAY + 17 * 3600)  # Thursday afternoon


@dataclass(frozen=True)
class Conditions:
    """One server's minute: per-token acceptance, load (1 = normal), KV-cache usage, pressure."""

    alpha: float
    load: float
    kv: float
    preemptions: int = 0
    slowdown: float = 1.0  # latency factor (KV pressure, preemptions)


@dataclass
class Minute:
    """What one server's minute added (the ground truth)."""

    at: float  # the minute's start
    drafts: int
    positions: list[int]
    draft_tokens: int
    generation_tokens: int
    requests: int
    preemptions: int
    kv: float  # the gauge at this minute's scrape
    latencies: dict[str, list[float]]  # e2e, ttft, itl: every observation

    @property
    def accepted(self) -> int:
        return sum(self.positions)


@dataclass
class Server:
    instance: str
    model: str
    k: int
    conditions: Callable[[float], Conditions]  # the minute's start -> its conditions
    counters: dict[str, float] = field(default_factory=dict)  # exposition line (no value) -> value
    kv: float = 0.0
    truth: list[Minute] = field(default_factory=list)


class Timeline:
    def __init__(self, servers: list[Server], seed: int = 7) -> None:
        self.servers = servers
        self.rng = random.Random(seed)

    def advance(self, server: Server, at: float) -> Minute:
        """Play ``server``'s minute starting at ``at``: its counters grow, its truth is kept."""
        c = server.conditions(at)
        rng = self.rng
        requests = max(0, round(c.load * 6 + rng.uniform(-2, 2)))
        drafts = max(0, round(c.load * 400 + rng.uniform(-20, 20)))
        # Chain model: position i is reached only when 0..i-1 were accepted (the expected share,
        # rounded at random so the counts stay whole).
        positions = []
        reached = drafts
        for _ in range(server.k):
            reached = int(reached * c.alpha + rng.random())
            positions.append(reached)
        accepted = sum(positions)
        speedup = (1 + accepted / drafts) / (1 + server.k * 0.05) if drafts else 1.0
        latencies: dict[str, list[float]] = {"e2e": [], "ttft": [], "itl": []}
        for _ in range(requests):
            latencies["ttft"].append(0.08 * c.slowdown * rng.lognormvariate(0, 0.4))
            latencies["e2e"].append(4.0 / speedup * c.slowdown * rng.lognormvariate(0, 0.3))
        for _ in range(requests * 4):
            latencies["itl"].append(0.06 / speedup * c.slowdown * rng.lognormvariate(0, 0.5))
        minute = Minute(
            at=at,
            drafts=drafts,
            positions=positions,
            draft_tokens=drafts * server.k,
            generation_tokens=accepted + drafts,
            requests=requests,
            preemptions=c.preemptions,
            kv=c.kv,
            latencies=latencies,
        )
        self._count(server, minute)
        server.kv = c.kv
        server.truth.append(minute)
        return minute

    def _count(self, server: Server, m: Minute) -> None:
        model = f'model_name="{server.model}"'
        add = server.counters

        def bump(line: str, by: float) -> None:
            add[line] = add.get(line, 0.0) + by

        bump(f'vllm:spec_decode_num_drafts_total{{engine="0",{model}}}', m.drafts)
        bump(f'vllm:spec_decode_num_draft_tokens_total{{engine="0",{model}}}', m.draft_tokens)
        bump(f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",{model}}}', m.accepted)
        for i, count in enumerate(m.positions):
            bump(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",{model},position="{i}"}}',
                count,
            )
        bump(f'vllm:generation_tokens_total{{engine="0",{model}}}', m.generation_tokens)
        # vLLM counts finished requests per reason: two series, summed by the signals.
        stopped = m.requests - m.requests // 4
        bump(f'vllm:request_success_total{{engine="0",finished_reason="stop",{model}}}', stopped)
        bump(
            f'vllm:request_success_total{{engine="0",finished_reason="length",{model}}}', m.requests - stopped
        )
        bump(f'vllm:num_preemptions_total{{engine="0",{model}}}', m.preemptions)
        for part, (name, buckets) in HISTOGRAMS.items():
            values = sorted(m.latencies[part])
            for upper in (*buckets, math.inf):
                le = "+Inf" if upper == math.inf else repr(upper)
                bump(f'{name}_bucket{{engine="0",le="{le}",{model}}}', bisect.bisect_right(values, upper))
            bump(f'{name}_sum{{engine="0",{model}}}', sum(values))
            bump(f'{name}_count{{engine="0",{model}}}', len(values))

    def exposition(self, server: Server) -> str:
        model = f'model_name="{server.model}"'
        lines = [
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{engine="0",{model}}} {server.kv!r}',
            f'vllm:num_requests_running{{engine="0",{model}}} 3.0',
            f'vllm:num_requests_waiting{{engine="0",{model}}} 0.0',
        ]
        lines += [f"{line} {value!r}" for line, value in server.counters.items()]
        return "\n".join(lines) + "\n"


# --- the test's own arithmetic (none of specguard's) ----------------------------------------------


def quantile(q: float, values_by_bucket: list[tuple[float, float]]) -> float | None:
    """Linear interpolation inside the bucket holding rank q·n, lower bound 0 for the first bucket,
    the highest finite bound when the rank falls in +Inf (Prometheus's rule, written out again)."""
    total = values_by_bucket[-1][1]
    if total == 0:
        return None
    rank = q * total
    uppers = [u for u, _ in values_by_bucket]
    counts = [c for _, c in values_by_bucket]
    i = bisect.bisect_left(counts, rank)
    if uppers[i] == math.inf:
        return uppers[-2]
    lower, below = (0.0, 0.0) if i == 0 else (uppers[i - 1], counts[i - 1])
    return lower + (uppers[i] - lower) * (rank - below) / (counts[i] - below)


def histogram(minutes: list[Minute], part: str) -> list[tuple[float, float]]:
    buckets = HISTOGRAMS[part][1]
    values = sorted(v for m in minutes for v in m.latencies[part])
    return [(upper, float(bisect.bisect_right(values, upper))) for upper in (*buckets, math.inf)]


# --- the week's two servers -----------------------------------------------------------------------


def hour_of(t: float) -> int:
    return int(t % DAY // 3600)


def server_a(t: float) -> Conditions:
    busy = 9 <= hour_of(t) < 18
    alpha = 0.80
    if COLLAPSE[0] <= t < COLLAPSE[1]:
        alpha = 0.25
    return Conditions(alpha=alpha, load=1.0 if busy else 0.5, kv=0.55 if busy else 0.3)


def server_b(t: float) -> Conditions:
    busy = 9 <= hour_of(t) < 18
    day = int((t - MONDAY) // DAY)
    alpha = 0.78 if t < MONDAY else 0.76 - 0.02 * day  # a draft losing ground day by day
    if PRESSURE[0] <= t < PRESSURE[1]:
        return Conditions(alpha=alpha, load=1.2, kv=0.97, preemptions=3, slowdown=1.6)
    return Conditions(alpha=alpha, load=1.0 if busy else 0.6, kv=0.6 if busy else 0.35)
