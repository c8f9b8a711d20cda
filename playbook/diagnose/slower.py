"""Case 1, "slower since speculation was enabled": acceptance, the draft's cost, the estimated
speedup, and KV-cache pressure, per vLLM server; the cause named and the step to take.

- **Acceptance**: vLLM's rate (accepted / draft tokens, which falls with k for the same drafts) and
  the chain model's per-token α̂ = S / (S + F) (``common/sequential.py``), which does not depend on
  k. α̂ is held to the playbook's lines: below 0.3 acceptance has collapsed, below 0.5 it is low.
- **Draft cost c** (one draft step over one target step), from the baseline: its
  ``speculative.draft_cost`` (``specguard bench --against --write-baseline`` measures it), else the
  ITL of the speculative run over the plain one in its ``without_speculation`` figures (a step is
  1 + k·c target steps), else the method's default (0 for n-gram, 0.05 for drafting heads).
- **Estimated speedup** MAL / (1 + k·c) (Leviathan et al., Theorem 3.8, with the window's mean
  acceptance length): below 1, speculation does not pay.
- **KV-cache pressure**: usage over 95 % at the window's peak, or preemptions rising over the
  window (more in its last hour than in its first; in a window under two hours, its last quarter
  than its first).

The cause is acceptance (α̂ under 0.3, or speculation not paying with α̂ under 0.5), the draft's
cost (speculation not paying though α̂ is 0.5 or more), or KV pressure; the steps are a better
draft, a lower k read off the k table (``metrics/ktable.py``), or the fallback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specguard.common.sequential import alpha_hat, chain_trials
from specguard.metrics import figures as window
from specguard.metrics.ktable import fmt, k_table
from specguard.metrics.speedup import best_k
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Figure, Finding, Verdict
from specguard.store.baseline import Baseline
from specguard.store.history import HOUR, ROUTE, Span

CASE = "slower"
TITLE = "Slower since speculation was enabled"
COLLAPSE = 0.3  # α̂ below this: acceptance has collapsed
LOW = 0.5  # α̂ below this: acceptance is low
KV_FULL = 0.95  # KV-cache usage above this at the window's peak: pressure
QUARTERS = 4  # a window under two hours is cut in this many stretches to see preemptions rise
ACCEPTANCE_LINE = f"< {COLLAPSE} collapse, < {LOW} low"
FALL_BACK = (
    "fall back to standard decoding: engage the flag of the config's feature_flag action, or restart "
    "vLLM without speculation with `specguard ladder set 0`"
)


@dataclass
class _Server:
    """What one server's window says, and the figures shown for it."""

    scope: str
    figures: list[Figure] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    suspicions: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    remedy: list[str] = field(default_factory=list)
    table: list[str] = field(default_factory=list)
    judged: bool = False  # it drafted in the window
    complete: bool = True  # the draft's cost and the KV-cache usage were known


def draft_cost(
    baseline: Baseline | None, instance: str, model: str, k: float | None
) -> tuple[float | None, str]:
    """c for a server and where it comes from (or, with None, why it is unknown)."""
    if baseline is None:
        return None, "no baseline (the config's `baseline:`): the draft's cost c is unknown"
    entry = baseline.entry_for({"model_name": model, "instance": instance})
    if isinstance(entry, str):
        return None, entry
    spec, plain = entry.speculative, entry.without_speculation
    if spec is not None and spec.draft_cost is not None:
        how = " (measured by `specguard bench --against`)" if plain is not None else ""
        return spec.draft_cost, f"baseline: speculative.draft_cost{how}"
    if plain is not None and k:
        for kind in ("signals", "client"):
            ours, theirs = getattr(entry, kind).get("itl_p50"), getattr(plain, kind).get("itl_p50")
            if ours and theirs:
                cost = max(0.0, (ours / theirs - 1) / k)
                return cost, (
                    f"baseline: ITL p50 {ours * 1000:.1f} ms with speculation vs {theirs * 1000:.1f} ms "
                    f"without ({'vLLM histograms' if kind == 'signals' else 'client'}, bench --against): "
                    f"c = (ratio - 1) / k"
                )
    cost = spec.cost() if spec is not None else None
    if isinstance(cost, float):
        return cost, f"baseline: the default for method {spec.method if spec else '?'}"
    if spec is None:
        return None, f"{entry.describe()} says nothing of the speculative method or its draft_cost"
    return None, cost or "no draft cost"


def stretch(start: float, end: float) -> tuple[float, str]:
    """What preemptions are counted by to see them rise: the hour, or in a window shorter than two
    hours, a quarter of it."""
    if end - start >= 2 * HOUR:
        return HOUR, "hour"
    quarter = (end - start) / QUARTERS
    return quarter, f"{quarter / 60:.3g} min" if quarter >= 60 else f"{quarter:.3g} s"


def preemptions_by(spans: Sequence[Span], start: float, end: float) -> list[float]:
    """The window's preemptions in each stretch from its start (a span falls in the stretch it
    starts in)."""
    length, _ = stretch(start, end)
    counts = [0.0] * max(1, math.ceil((end - start) / length - 1e-9))
    for span in spans:
        index = min(len(counts) - 1, max(0, int((span.start - start) // length)))
        counts[index] += span.parts.get("preemptions", 0.0)
    return counts


def rising(counts: Sequence[float]) -> bool:
    """Preemptions rising over the window: more in its last stretch than in its first, and some in
    the last."""
    return len(counts) >= 2 and counts[-1] > counts[0] and counts[-1] > 0


def _judge_server(instance: str, model: str, spans: Sequence[Span], evidence: Evidence) -> _Server:
    scope = f"{instance} {model}".strip()
    out = _Server(scope)
    parts, minutes = window.total(spans)
    figs = window.figures(parts, minutes)
    drafts = parts.get("drafts", 0.0)
    source = evidence.source
    if drafts <= 0:
        out.missing.append(f"{scope}: no speculative-decoding drafts in the window")
        return out
    out.judged = True
    k = window.positions(parts)
    per_pos = window.per_position(parts)
    full = parts.get(f"pos:{k - 1}", 0.0) if k else 0.0
    s, f = chain_trials(parts.get("accepted", 0.0), drafts, full)
    alpha = alpha_hat(s, f)
    rate, mal = figs["acceptance_rate"], figs["mean_acceptance_length"]
    stepped = window.drafted_per_step(parts)
    add = out.figures.append
    add(Figure("acceptance_rate", rate, "", "vLLM's accepted / draft tokens (falls with k)", source, scope))
    add(Figure("alpha_hat", alpha, "", ACCEPTANCE_LINE, source + ": S / (S + F), chain model", scope))
    add(Figure("mean_acceptance_length", mal, "tokens", "", source, scope))
    add(Figure("k", k, "", "", source + ": draft positions", scope))
    if len(window.drafts_by_k(parts)) > 1:
        out.suspicions.append(f"{scope}: k changed inside the window; α̂ counts the last k's full drafts")
    if alpha is not None and alpha < COLLAPSE:
        out.causes.append(f"acceptance collapsed on {scope}: α̂ {alpha:.2f} < {COLLAPSE}")
    elif alpha is not None and alpha < LOW:
        out.suspicions.append(f"acceptance is low on {scope}: α̂ {alpha:.2f} < {LOW}")

    cost, cost_source = draft_cost(evidence.baseline, instance, model, stepped)
    add(Figure("draft_cost", cost, "", "", cost_source, scope))
    speedup = window.speedup(mal, stepped, cost)
    add(Figure("estimated_speedup", speedup, "x", "< 1: speculation does not pay",
               "MAL / (1 + k·c)" if speedup is not None else "needs c", scope))  # fmt: skip
    if cost is None:
        out.complete = False
        out.missing.append(f"{scope}: the draft's cost c ({cost_source})")
    elif speedup is not None and speedup < 1:
        if alpha is not None and alpha < LOW:
            if alpha >= COLLAPSE:
                out.causes.append(
                    f"acceptance is too low to pay on {scope}: α̂ {alpha:.2f}, speedup {speedup:.2f}x"
                )
        else:
            out.causes.append(
                f"the draft costs too much on {scope}: c = {cost:.3g} at k = {k} eats the gain of "
                f"MAL {mal:.2f} (speedup {speedup:.2f}x)"
            )

    peak, mean = figs["kv_cache_usage_max"], figs["kv_cache_usage_mean"]
    by_hour = preemptions_by(spans, evidence.start, evidence.end)
    _, each = stretch(evidence.start, evidence.end)
    preempted = parts.get("preemptions", 0.0)
    add(Figure("kv_cache_usage_peak", None if peak is None else peak * 100, "%", f"> {KV_FULL * 100:.0f} %: pressure", source, scope))  # fmt: skip
    add(Figure("kv_cache_usage_mean", None if mean is None else mean * 100, "%", "", source, scope))
    add(Figure("preemptions", preempted, "", "rising over the window: pressure",
               source + (f": per {each} " + ", ".join(fmt(c) for c in by_hour) if len(by_hour) > 1 else ""), scope))  # fmt: skip
    if peak is None:
        out.complete = False
        out.missing.append(f"{scope}: KV-cache usage (vllm:kv_cache_usage_perc, vLLM >= 0.9.2)")
    pressure = []
    if peak is not None and peak > KV_FULL:
        pressure.append(f"KV-cache usage peaked at {peak * 100:.0f} %")
    if rising(by_hour):
        pressure.append(f"preemptions rose from {fmt(by_hour[0])} to {fmt(by_hour[-1])} per {each}")
    if pressure:
        out.causes.append(f"KV-cache pressure on {scope}: " + " and ".join(pressure))
    elif preempted > 0:
        out.suspicions.append(f"{scope}: {fmt(preempted)} preemptions in the window")

    if per_pos and cost is not None:
        best = best_k(per_pos, cost, current_k=k or None)
        out.table = [f"{scope}:", *k_table(best, per_pos)]
        out.remedy.extend(_steps(out, k, best.k, best.speedup, speedup))
    elif out.causes:
        out.remedy.append(
            "lower k: measure the draft's cost to read the k table (`specguard bench --against`)"
        )
        out.remedy.append(FALL_BACK)
    return out


def _steps(out: _Server, k: int, best: int, best_speedup: float, speedup: float | None) -> list[str]:
    if not out.causes:
        return []
    steps: list[str] = []
    acceptance = any(c.startswith("acceptance") for c in out.causes)
    costly = any(c.startswith("the draft costs") for c in out.causes)
    kv = any(c.startswith("KV-cache") for c in out.causes)
    if acceptance:
        steps.append(
            f"{out.scope}: change the draft: one trained on this traffic and its sampling (check the "
            "pair with `specguard compat`; per-class acceptance: case 2)"
        )
    if costly:
        steps.append(f"{out.scope}: change the draft for a cheaper one (an EAGLE head, n-gram) or lower k")
    if best < k and best_speedup >= 1:
        gain = "" if speedup is None else f" (now {speedup:.2f}x)"
        steps.append(
            f"{out.scope}: lower k from {k} to {best}: expected speedup {best_speedup:.2f}x{gain}, "
            f"see the k table; `specguard ladder set {best}`"
        )
    elif kv:
        steps.append(
            f"{out.scope}: lower k (each draft token holds KV-cache) or --max-num-seqs; "
            "`specguard ladder down`"
        )
    if best_speedup < 1 or acceptance or kv:
        steps.append(
            f"{out.scope}: {FALL_BACK}" + (" (no k pays with this draft)" if best_speedup < 1 else "")
        )
    return steps


async def judge(evidence: Evidence) -> Finding:
    servers = [
        _judge_server(instance, model, spans, evidence)
        for (instance, model), spans in sorted(evidence.servers.items())
        if not any(key.startswith(ROUTE) for span in spans for key in span.parts)
    ]
    judged = [s for s in servers if s.judged]
    figures = tuple(f for s in servers for f in s.figures)
    missing = [m for s in servers for m in s.missing] + list(evidence.notes)
    causes = [c for s in judged for c in s.causes]
    suspicions = [c for s in judged for c in s.suspicions]
    remedy = tuple(step for s in judged for step in s.remedy)
    details: dict[str, object] = {"k_table": [line for s in judged for line in s.table]}
    if not judged:
        if not servers:
            missing.insert(0, "no vLLM server in the window's data")
        return Finding(CASE, TITLE, Verdict.UNKNOWN, "not enough data: no drafts in the window",
                       figures, (), tuple(missing), details)  # fmt: skip
    if causes:
        return Finding(
            CASE, TITLE, Verdict.CAUSE_FOUND, "; ".join(causes), figures, remedy, tuple(missing), details
        )
    if suspicions:
        return Finding(
            CASE, TITLE, Verdict.SUSPECT, "; ".join(suspicions), figures, remedy, tuple(missing), details
        )
    if not all(s.complete for s in judged):
        return Finding(CASE, TITLE, Verdict.UNKNOWN,
                       "acceptance is fine, but whether speculation pays cannot be told: " + "; ".join(missing),
                       figures, (), tuple(missing), details)  # fmt: skip
    speedups = [f.value for f in figures if f.name == "estimated_speedup" and isinstance(f.value, float)]
    low = min(speedups) if speedups else math.nan
    return Finding(CASE, TITLE, Verdict.FINE,
                   f"speculation pays (estimated speedup {low:.2f}x or more), acceptance over {LOW}, "
                   "no KV-cache pressure", figures, (), tuple(missing), details)  # fmt: skip
