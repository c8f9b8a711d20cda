"""vLLM /metrics pages for tests: the real vLLM 0.32.0 captures, edited sample by sample, and a
clock the tests move by hand."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SELF_DRAFT = (FIXTURES / "vllm-0.32.0-cpu-metrics-self-draft.prom").read_text()
REJECTING = (FIXTURES / "vllm-0.32.0-cpu-metrics-rejecting-draft.prom").read_text()

TARGET = "http://127.0.0.1:8000/metrics"
INSTANCE = "127.0.0.1:8000"
MODEL = "tiny-llama"

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "vllm:generation_tokens_total"
KV_CACHE = "vllm:kv_cache_usage_perc"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
E2E = "vllm:e2e_request_latency_seconds"
ITL = "vllm:inter_token_latency_seconds"


_SAMPLE = re.compile(r"^(?P<name>[^\s{]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")


def rewrite(text: str, name: str, change: Callable[[float], float], **labels: str) -> str:
    """``text`` with every ``name`` sample carrying ``labels`` passed through ``change``."""
    lines, hits = [], 0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name:
            label_text = match["labels"] or ""
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                line = f"{name}{label_text} {change(float(match['value']))!r}"
                hits += 1
        lines.append(line)
    assert hits, f"no {name} sample with {labels} in the text"
    return "\n".join(lines) + "\n"


def add(text: str, name: str, delta: float, **labels: str) -> str:
    return rewrite(text, name, lambda value: value + delta, **labels)


def set_value(text: str, name: str, value: float, **labels: str) -> str:
    return rewrite(text, name, lambda _: value, **labels)


def add_many(text: str, deltas: dict[str, float], **labels: str) -> str:
    for name, delta in deltas.items():
        text = add(text, name, delta, **labels)
    return text


def add_per_position(text: str, deltas: Sequence[float], **labels: str) -> str:
    for position, delta in enumerate(deltas):
        text = add(text, PER_POS, delta, position=str(position), **labels)
    return text


def observe(text: str, histogram: str, observations: Sequence[float], **labels: str) -> str:
    """``text`` after ``histogram`` observed ``observations`` (cumulative buckets, count, sum)."""
    bounds = set(re.findall(rf'^{re.escape(histogram)}_bucket\{{[^}}]*le="([^"]+)"', text, re.M))
    assert bounds, f"no buckets for {histogram}"
    for le in bounds:
        below = sum(1 for value in observations if value <= float(le))
        text = add(text, f"{histogram}_bucket", below, le=le, **labels)
    text = add(text, f"{histogram}_count", len(observations), **labels)
    return add(text, f"{histogram}_sum", sum(observations), **labels)


def with_engine_one(text: str) -> str:
    """A data-parallel server: every engine-0 series also exists for engine 1, same values."""
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            lines.append(line.replace('engine="0"', 'engine="1"'))
    return "\n".join(lines) + "\n"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
