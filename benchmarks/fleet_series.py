"""A fleet of vLLM servers as a central Prometheus holds them, written as OpenMetrics text for
``promtool tsdb create-blocks-from openmetrics``.

The families are the signal catalog's vLLM metrics that a real vLLM 0.32.0 page exposes (the first
name of each ``Metric`` the page has), with that page's labels (``engine``, ``position``, ``le``,
``finished_reason``), the server's model in ``model_name`` and the labels Prometheus adds, ``instance``
and ``job``. Every server serves one of four models with its own k, traffic and draft quality; its
counters start from a realistic uptime and move as the chain model says: drafts arrive as a Poisson
process, position i is accepted only when 0..i-1 were, each with the server's per-token acceptance.
Some servers fall to a per-token acceptance of 0.25 (``collapsed``: 7 minutes before the end, or
``late``: 90 s before it), which also makes their requests slower; a few run with a nearly full KV
cache (``pressured``). The same server index always gets the same series, whatever the fleet's size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from specguard.rules.router_signals import ROUTER_SIGNALS
from specguard.rules.signals import CATALOG, Metric
from specguard.sources.quantiles import bucket_quantile

CAPTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "vllm-0.32.0-cpu-metrics-self-draft.prom"
SAMPLE = re.compile(r"^([^\s{#]+)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
JOB = "vllm"
OUT_TOKENS = 180.0  # output tokens per request, on average
COLLAPSED_ALPHA = 0.25
EARLY, LATE = 420, 90  # seconds before the end at which collapsed and late servers fall


@dataclass(frozen=True)
class Model:
    name: str
    k: int  # num_speculative_tokens
    e2e_median: float  # seconds, a healthy request
    step: float  # seconds per engine step (one draft and its verification)
    e2e_sigma: float = 0.45


MODELS = (
    Model("meta-llama/Llama-3.1-8B-Instruct", 3, 1.1, 0.018),
    Model("meta-llama/Llama-3.1-70B-Instruct", 5, 2.6, 0.045),
    Model("Qwen/Qwen2.5-32B-Instruct", 4, 1.9, 0.032),
    Model("mistralai/Mistral-Small-24B-Instruct-2501", 4, 1.6, 0.027),
)


@dataclass(frozen=True)
class Family:
    """One family of the page: its exposition name (histograms without ``_bucket``), its type, and
    its series as the page gives them: (sample name, labels with ``le``, without ``model_name``)."""

    name: str
    type: str
    series: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def families(capture: Path = CAPTURE) -> list[Family]:
    """The catalog's vLLM families as the real page has them, in the catalog's order."""
    types: dict[str, str] = {}
    labels: dict[str, list[tuple[str, tuple[tuple[str, str], ...]]]] = {}
    for line in capture.read_text().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        match = SAMPLE.match(line)
        if match is None:
            continue
        found = tuple((k, v) for k, v in LABEL.findall(match[2] or "") if k != "model_name")
        labels.setdefault(match[1], []).append((match[1], found))
    router = {m.names for s in ROUTER_SIGNALS for m in (s.metric, s.denominator) if m is not None}
    wanted: list[Metric] = []
    for signal in CATALOG.values():
        for metric in (signal.metric, signal.denominator, signal.per_position, signal.draft_tokens):
            if metric is not None and metric.names not in router and metric not in wanted:
                wanted.append(metric)
    out: list[Family] = []
    for metric in wanted:
        present = next((n for n in metric.names if n in types), None)
        if present is None:  # a histogram's _sum or _count: part of its histogram
            assert any(metric.names[0].startswith(h.name) for h in out), metric.names
            continue
        if types[present] == "histogram":
            series = [*labels[present + "_bucket"], *labels[present + "_sum"], *labels[present + "_count"]]
        else:
            series = labels[present]
        out.append(Family(present, types[present], tuple(series)))
    return out


@dataclass
class Server:
    """One server's traffic over the steps, and what its counters held at the first step."""

    index: int
    model: Model
    instance: str
    alpha: np.ndarray  # per-token acceptance at each step
    drafts: np.ndarray  # drafts in each step
    positions: np.ndarray  # (k, steps): accepted at each position in each step
    finished: np.ndarray  # requests finished in each step
    scale: float  # this server's latencies against its model's
    uptime: float  # seconds before the first step
    kv: np.ndarray
    pressured: bool

    def slow(self) -> np.ndarray:
        """How much longer a request takes than at the server's own acceptance."""
        return np.asarray(
            tokens_per_step(self.alpha[0], self.model.k) / tokens_per_step(self.alpha, self.model.k)
        )


def tokens_per_step(alpha: float | np.ndarray, k: int) -> np.ndarray:
    """Tokens one draft yields, the bonus token included: 1 + alpha + ... + alpha^k."""
    a = np.asarray(alpha, dtype=float)
    return sum((a ** (i + 1) for i in range(k)), start=np.ones_like(a))


def instance_of(index: int) -> str:
    return f"10.{index // 62500}.{index // 250 % 250}.{index % 250 + 1}:8000"


def kind_of(index: int) -> str:
    """healthy, collapsed (early), late (collapses during the rounds) or pressured (KV cache)."""
    if index % 37 == 5:
        return "collapsed"
    if index % 53 == 11:
        return "late"
    if index % 71 == 3:
        return "pressured"
    return "healthy"


def server(index: int, times: np.ndarray, step: int) -> Server:
    rng = np.random.default_rng([2026, index])
    model = MODELS[index % len(MODELS)]
    kind = kind_of(index)
    alpha = np.full(len(times), rng.uniform(0.8, 0.9))
    end = times[-1]
    if kind in ("collapsed", "late"):
        alpha[times > end - (EARLY if kind == "collapsed" else LATE)] = COLLAPSED_ALPHA
    request_rate = rng.uniform(0.5, 3.0)
    draft_rate = request_rate * OUT_TOKENS / tokens_per_step(alpha[0], model.k)
    drafts = rng.poisson(draft_rate * step, len(times))
    positions = np.empty((model.k, len(times)), dtype=np.int64)
    before = drafts
    for i in range(model.k):  # position i counts drafts whose tokens 0..i were all accepted
        before = positions[i] = rng.binomial(before, alpha)
    kv_base = rng.uniform(0.955, 0.975) if kind == "pressured" else rng.uniform(0.2, 0.8)
    phase = rng.uniform(0, 2 * math.pi)
    wave = 0.03 * np.sin(2 * math.pi * times / 600 + phase) + rng.normal(0, 0.01, len(times))
    return Server(
        index=index,
        model=model,
        instance=instance_of(index),
        alpha=alpha,
        drafts=drafts,
        positions=positions,
        finished=rng.poisson(request_rate * step, len(times)),
        scale=rng.uniform(0.9, 1.1),
        uptime=rng.uniform(2 * 3600, 3 * 86400),
        kv=np.clip(kv_base + (0.0 if kind == "pressured" else 1.0) * wave, 0.0, 1.0),
        pressured=kind == "pressured",
    )


def lognormal_shares(bounds: Sequence[float], median: float, sigma: float) -> np.ndarray:
    """The share of a lognormal's mass in each bucket (the last one up to +Inf)."""
    cdf = [0.5 * (1 + math.erf(math.log(b / median) / (sigma * math.sqrt(2)))) for b in bounds[:-1]]
    edges = np.array([0.0, *cdf, 1.0])
    return np.diff(edges)


def representatives(bounds: Sequence[float]) -> np.ndarray:
    """A value inside each bucket, for the histogram's sum."""
    lower = [0.0, *bounds[:-1]]
    return np.array(
        [
            hi / 2 if lo == 0 else lo * 1.5 if math.isinf(hi) else math.sqrt(lo * hi)
            for lo, hi in zip(lower, bounds, strict=True)
        ]
    )


# Per histogram family: (observations per step, median per step, sigma) of a server.
Histogram = Callable[[Server], tuple[np.ndarray, np.ndarray, float]]
HISTOGRAMS: dict[str, Histogram] = {
    "vllm:e2e_request_latency_seconds": lambda s: (
        s.finished,
        s.model.e2e_median * s.scale * s.slow(),
        s.model.e2e_sigma,
    ),
    "vllm:time_to_first_token_seconds": lambda s: (s.finished, np.full(len(s.finished), 0.12 * s.scale), 0.6),
    "vllm:inter_token_latency_seconds": lambda s: (
        s.drafts,
        np.full(len(s.drafts), s.model.step * s.scale),
        0.3,
    ),
    "vllm:request_time_per_output_token_seconds": lambda s: (
        s.finished,
        s.model.step * s.scale / tokens_per_step(s.alpha, s.model.k),
        0.25,
    ),
}


def bucket_bounds(family: Family) -> list[str]:
    return [dict(labels)["le"] for sample, labels in family.series if sample.endswith("_bucket")]


def histogram(family: Family, s: Server, step: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Cumulative values of the family's series, keyed by ``le`` (and ``_sum``, ``_count``)."""
    les = bucket_bounds(family)
    bounds = [math.inf if le == "+Inf" else float(le) for le in les]
    observations, medians, sigma = HISTOGRAMS[family.name](s)
    counts = np.zeros((len(observations), len(bounds)), dtype=np.int64)
    for median in np.unique(medians):  # one draw per regime (healthy, collapsed)
        at = medians == median
        counts[at] = rng.multinomial(observations[at], lognormal_shares(bounds, float(median), sigma))
    start_shares = lognormal_shares(bounds, float(medians[0]), sigma)
    start = np.floor(np.cumsum(start_shares) * observations.mean() / step * s.uptime).astype(np.int64)
    buckets = start + np.cumsum(np.cumsum(counts, axis=1), axis=0)  # cumulative over le, then time
    reps = representatives(bounds)
    total = float(start_shares @ reps) * start[-1] + np.cumsum(counts @ reps)
    out = {le: buckets[:, b] for b, le in enumerate(les)}
    out["_sum"] = total
    out["_count"] = buckets[:, -1]
    return out


def counter(name: str, labels: dict[str, str], s: Server, step: int) -> np.ndarray | None:
    """A counter's cumulative values; None for a series this server does not have."""
    drafts0 = s.uptime / step * s.drafts.mean()
    if name == "vllm:spec_decode_num_drafts_total":
        return np.asarray(np.floor(drafts0) + np.cumsum(s.drafts), dtype=float)
    if name == "vllm:spec_decode_num_draft_tokens_total":
        return np.asarray((np.floor(drafts0) + np.cumsum(s.drafts)) * s.model.k, dtype=float)
    if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
        p = int(labels["position"])
        if p >= s.model.k:
            return None
        return np.asarray(np.floor(drafts0 * s.alpha[0] ** (p + 1)) + np.cumsum(s.positions[p]), dtype=float)
    accepted0 = drafts0 * float(tokens_per_step(s.alpha[0], s.model.k) - 1)
    accepted = np.floor(accepted0) + np.cumsum(s.positions.sum(axis=0))
    if name == "vllm:spec_decode_num_accepted_tokens_total":
        return np.asarray(accepted, dtype=float)
    if name == "vllm:generation_tokens_total":
        return np.asarray(accepted + np.floor(drafts0) + np.cumsum(s.drafts), dtype=float)
    if name == "vllm:request_success_total":
        share = {"stop": 0.8, "length": 0.2}.get(labels["finished_reason"], 0.0)
        requests = s.uptime / step * s.finished.mean() + np.cumsum(s.finished)
        return np.asarray(np.floor(requests * share), dtype=float)
    if name == "vllm:num_preemptions_total":
        rate = 0.3 if s.pressured else 0.002
        events = np.random.default_rng([2026, s.index, 1]).poisson(rate * step, len(s.drafts))
        return np.asarray(np.floor(rate * s.uptime) + np.cumsum(events), dtype=float)
    raise ValueError(f"no model for counter {name}")


def gauge(name: str, s: Server, step: int, rng: np.random.Generator) -> np.ndarray:
    if name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        return np.asarray(np.round(s.kv, 4))
    if name == "vllm:num_requests_running":
        in_flight = s.finished.mean() / step * s.model.e2e_median * s.scale * s.slow()
        return np.asarray(rng.poisson(in_flight), dtype=float)
    if name == "vllm:num_requests_waiting":
        return rng.poisson(3.0 if s.pressured else 0.05, len(s.drafts)).astype(float)
    raise ValueError(f"no model for gauge {name}")


def series_of(family: Family, s: Server, step: int) -> Iterator[tuple[str, np.ndarray]]:
    """(sample name with labels, values) of each of the family's series on server ``s``."""
    rng = np.random.default_rng([2026, s.index, len(family.name)])
    hist = histogram(family, s, step, rng) if family.type == "histogram" else None
    for sample, labels in family.series:
        named = dict(labels)
        if hist is not None:
            values = hist[named["le"] if "le" in named else sample.removeprefix(family.name)]
        elif family.type == "counter":
            found = counter(family.name, named, s, step)
            if found is None:
                continue
            values = found
        else:
            values = gauge(family.name, s, step, rng)
        named.update(instance=s.instance, job=JOB, model_name=s.model.name)
        body = ",".join(f'{k}="{v}"' for k, v in sorted(named.items()))
        yield f"{sample}{{{body}}} ", values


@dataclass(frozen=True)
class Written:
    servers: int
    series: int
    samples: int
    start: int
    end: int
    step: int
    kinds: dict[str, int]  # how many servers of each kind


def write(out: TextIO, count: int, end: int, span: int, step: int) -> Written:
    """``count`` servers' series, sampled every ``step`` seconds over ``span`` seconds up to ``end``."""
    times = np.arange(end - span, end + 1, step)
    stamps = [f" {t}\n" for t in times.tolist()]
    servers = [server(i, times, step) for i in range(count)]
    series = samples = 0
    for family in families():
        # OpenMetrics: a family's samples all together; counters are named without _total.
        kind = family.type
        declared = family.name.removesuffix("_total") if kind == "counter" else family.name
        out.write(f"# TYPE {declared} {kind}\n")
        for s in servers:
            for prefix, values in series_of(family, s, step):
                text = [repr(v) for v in values.tolist()]
                out.write("".join([prefix + v + t for v, t in zip(text, stamps, strict=True)]))
                series += 1
                samples += len(text)
    out.write("# EOF\n")
    kinds: dict[str, int] = {}
    for i in range(count):
        kinds[kind_of(i)] = kinds.get(kind_of(i), 0) + 1
    return Written(count, series, samples, int(times[0]), int(times[-1]), step, kinds)


def baseline() -> dict[str, object]:
    """The baseline file a fleet's operator would have measured: per model, the healthy e2e p95 as
    the histogram reads it and the mean, and the draft method (eagle3: c from the head's cost)."""
    e2e = next(f for f in families() if f.name == "vllm:e2e_request_latency_seconds")
    les = bucket_bounds(e2e)
    bounds = [math.inf if le == "+Inf" else float(le) for le in les]
    entries = []
    for model in MODELS:
        shares = lognormal_shares(bounds, model.e2e_median, model.e2e_sigma)
        p95 = bucket_quantile(0.95, zip(bounds, np.cumsum(shares).tolist(), strict=True))
        mean = model.e2e_median * math.exp(model.e2e_sigma**2 / 2)
        entries.append(
            {
                "model": model.name,
                "signals": {"e2e_latency_p95": round(p95, 4), "e2e_latency_mean": round(mean, 4)},
                "signals_from": "vllm_metrics",
                "speculative": {"method": "eagle3"},
            }
        )
    return {
        "version": 2,
        "measured_at": "2026-11-30T10:00:00Z",
        "method": "fleet benchmark",
        "entries": entries,
    }
