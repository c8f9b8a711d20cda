"""Item 6: no KV-cache pressure. vLLM preallocates GPU memory up to ``gpu_memory_utilization``, so
GPU memory says nothing; the KV cache's usage and the preemptions do. Over the last
``preflight.acceptance_period`` of history, each server's KV-cache usage at its peak (the fullest
engine at any scrape) must stay under ``preflight.max_kv_cache_usage`` (95 %), and no minute may hold
more than ``preflight.max_preemptions_per_minute`` preemptions (a burst)."""

from __future__ import annotations

import time

from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.items.acceptance import coverage, run_daemon
from specguard.preflight.window import Unread, Window, minutes, period, read
from specguard.store.history import HOUR, MINUTE, Span

NUMBER = 6
KEY = "kv_cache"
TITLE = "KV cache under pressure limits at peak"


def _at(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


async def check(ctx: Context) -> Answer:
    settings = ctx.loaded.config.preflight
    window = await read(ctx, settings.acceptance_period)
    if isinstance(window, Unread):
        return Answer(Status.UNKNOWN, (window.why,))
    evidence: list[str] = []
    failed = False
    for (instance, model), spans in sorted(window.spans.items()):
        peak = _peak(spans)
        if peak is None:
            continue
        usage, when = peak
        held = sum(span.minutes for span in spans)
        over = usage >= settings.max_kv_cache_usage
        evidence.append(
            f"{instance} {model}: KV-cache usage at peak {usage:.1%} ({when}), "
            f"{'NOT under' if over else 'under'} {settings.max_kv_cache_usage:.0%} ({coverage(window, held)})"
        )
        preempted = sum(span.parts.get("preemptions", 0.0) for span in spans)
        bursts = await _bursts(ctx, window, (instance, model), spans, settings.max_preemptions_per_minute)
        if bursts:
            worst = max(bursts, key=lambda b: b[1])
            evidence.append(
                f"  {preempted:,.0f} preemptions; {len(bursts)} minute(s) over "
                f"{settings.max_preemptions_per_minute} (a burst), the worst {worst[1]:,.0f} at {_at(worst[0])}"
            )
        else:
            evidence.append(
                f"  {preempted:,.0f} preemptions, no minute over {settings.max_preemptions_per_minute}"
            )
        failed = failed or over or bool(bursts)
    if not evidence:
        return Answer(Status.FAIL, (f"no KV-cache reading in the last {period(settings.acceptance_period)} of "
                                    "history",), run_daemon(ctx))  # fmt: skip
    if failed:
        return Answer(Status.FAIL, tuple(evidence),
                      "lower k (`specguard ladder set K`: draft tokens take KV space too), lower max-num-seqs, "
                      "or add capacity (gpu_memory_utilization, tensor parallelism, replicas)")  # fmt: skip
    return Answer(Status.PASS, tuple(evidence))


def _peak(spans: list[Span]) -> tuple[float, str] | None:
    """The highest KV-cache usage, and when: its minute, or the hour whose row holds it."""
    found = [(span.parts["max:kv"], -span.start, span) for span in spans if "max:kv" in span.parts]
    if not found:
        return None
    usage, _, span = max(found)  # the earliest span of the highest
    return usage, (f"in the hour from {_at(span.start)}" if span.minutes > 1 else f"at {_at(span.start)}")


async def _bursts(ctx: Context, window: Window, key: tuple[str, str], spans: list[Span],
                  most: int) -> list[tuple[float, float]]:  # fmt: skip
    """(minute, preemptions) of every minute over ``most``: hour rows first, then the minutes of
    the hours that could hold one."""
    out: list[tuple[float, float]] = []
    for span in spans:
        count = span.parts.get("preemptions", 0.0)
        if count <= most:
            continue
        if span.minutes == 1:  # a minute row (or an hour holding one minute): its count is the minute's
            out.append((float(span.start), count))
            continue
        start = max(window.start, float(span.start))
        inside = await minutes(ctx, start, min(window.end, span.start + HOUR + MINUTE))
        out += [(float(m.start), m.parts.get("preemptions", 0.0)) for m in inside.get(key, [])
                if m.parts.get("preemptions", 0.0) > most and span.start <= m.start < span.start + HOUR]  # fmt: skip
    return out
