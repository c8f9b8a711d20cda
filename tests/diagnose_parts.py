"""History components of a window with a given acceptance, as vLLM's counters would add up under
the chain model (position i accepted with probability alpha given the ones before), for the tests
of ``specguard diagnose``; and a vLLM /metrics page with given counter values."""

from __future__ import annotations

from specguard.store.history import Components, Span

MODEL = "llama"  # the model_name of page()


def chain_parts(alpha: float, k: int, drafts: float = 10_000.0, **more: float) -> Components:
    """The counters of ``drafts`` drafts of k tokens at per-token acceptance ``alpha``: p_i =
    alpha^(i+1) of them reached position i; the other components as given."""
    reached = [drafts * alpha ** (i + 1) for i in range(k)]
    parts: Components = {
        "drafts": drafts,
        f"drafts:k={k}": drafts,
        "draft_tokens": drafts * k,
        "accepted": sum(reached),
        **{f"pos:{i}": value for i, value in enumerate(reached)},
    }
    parts.update(more)
    return parts


def kv(peak: float, mean: float | None = None, samples: float = 60.0) -> Components:
    """KV-cache usage readings: ``samples`` of them averaging ``mean``, the fullest ``peak``."""
    return {"kv:sum": (peak if mean is None else mean) * samples, "kv:n": samples, "max:kv": peak}


def span(start: int, parts: Components, minutes: int = 60) -> Span:
    return Span(start, minutes, parts)


def page(drafts: float, accepted: float, per_pos: list[float], kv: float, preemptions: float = 0.0) -> str:
    """A vLLM /metrics page (the lines specguard reads) with these counter values."""
    head = f'model_name="{MODEL}",engine="0"'
    lines = [
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{head}}} {drafts}",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{head}}} {drafts * len(per_pos)}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{head}}} {accepted}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{head},position="{i}"}} {v}' for i, v in enumerate(per_pos)),
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{head}}} {kv}",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{head}}} {preemptions}",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"
