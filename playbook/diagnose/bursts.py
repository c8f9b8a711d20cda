"""Case 3, "bursty streaming": how many tokens a streamed chunk carries, the gap between chunks
against the time per token, the burst size the mean acceptance length (MAL) predicts, and the
client-side smoothing that hides it.

With speculative decoding an engine step emits its accepted tokens and the bonus token together:
one chunk of MAL tokens on average, up to k + 1. vLLM's ``inter_token_latency_seconds`` histogram
observes one interval per step of a request (per chunk), not per token, so the gap between chunks
is MAL times the time per token. A client that prints each chunk as it comes shows text in jumps;
one that releases a token every (ITL per chunk / tokens per chunk) seconds shows it evenly, at the
same rate.

The numbers come from a ``specguard bench --json`` result when one is given (its client timed
every chunk: ``tokens_per_chunk``, ``itl`` per chunk, ``itl_per_token``), else from vLLM's
histograms in the window: ITL per chunk = ITL sum / count, tokens per chunk = (generation tokens
- one first token per request) / ITL count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specguard.metrics import figures as window
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Figure, Finding, Verdict
from specguard.store.history import ROUTE

CASE = "bursty_stream"
TITLE = "Bursty streaming"
BURSTY = 1.5  # tokens per chunk at or above this: streams come in bursts
SUSPECT = 1.2  # above this: some steps emit several tokens
CHUNK_LINE = f">= {BURSTY}: bursts, >= {SUSPECT}: some"
# Chunks much larger than the mean acceptance length predicts were joined after the engine (the
# API server's output queue, a proxy, the client): speculation does not explain them.
BEYOND_MAL = 1.5


def _from_bench(bench: Mapping[str, Any]) -> tuple[dict[str, dict[str, float | None]], str]:
    """Per class: tokens per chunk, ITL per chunk and per token (means), MAL, output tokens."""
    out: dict[str, dict[str, float | None]] = {}
    for klass, phase in (bench.get("phases") or {}).items():
        if not isinstance(phase, Mapping):
            continue
        summary = phase.get("summary") or {}
        acceptance = phase.get("acceptance") or {}
        out[str(klass)] = {
            "tokens_per_chunk": summary.get("tokens_per_chunk"),
            "itl_per_chunk": (summary.get("itl") or {}).get("mean"),
            "itl_per_token": (summary.get("itl_per_token") or {}).get("mean"),
            "mean_acceptance_length": acceptance.get("mean_acceptance_length"),
            "weight": summary.get("output_tokens") or 0,
        }
    url = (bench.get("server") or {}).get("url", "?")
    return out, f"bench --json ({url}, as its client timed the chunks)"


def _from_histograms(evidence: Evidence) -> dict[str, dict[str, float | None]]:
    """Per server: the same figures from vLLM's ITL histogram and counters in the window."""
    out: dict[str, dict[str, float | None]] = {}
    for (instance, model), spans in sorted(evidence.servers.items()):
        if any(key.startswith(ROUTE) for span in spans for key in span.parts):
            continue
        parts, minutes = window.total(spans)
        count, total = parts.get("itl:count", 0.0), parts.get("itl:sum", 0.0)
        later = parts.get("generation_tokens", 0.0) - parts.get("requests", 0.0)
        if count <= 0 or later <= 0:
            continue
        out[f"{instance} {model}".strip()] = {
            "tokens_per_chunk": later / count,
            "itl_per_chunk": total / count,
            "itl_per_token": total / later,
            "mean_acceptance_length": window.figures(parts, minutes)["mean_acceptance_length"],
            "weight": later,
        }
    return out


def _overall(rows: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    """The rows together, weighted by their tokens (the classes of a bench, the servers)."""
    usable = {
        name: row for name, row in rows.items() if row.get("tokens_per_chunk") and row.get("itl_per_chunk")
    }
    weight = sum(float(row.get("weight") or 0) for row in usable.values())
    if not usable or weight <= 0:
        return {}
    out: dict[str, float | None] = {}
    for key in ("tokens_per_chunk", "itl_per_chunk", "itl_per_token", "mean_acceptance_length"):
        values = [(row.get(key), float(row.get("weight") or 0)) for row in usable.values()]
        known = [(v, w) for v, w in values if v is not None]
        share = sum(w for _, w in known)
        out[key] = sum(v * w for v, w in known) / share if known and share > 0 else None
    return out


async def judge(evidence: Evidence) -> Finding:
    if evidence.bench is not None:
        rows, source = _from_bench(evidence.bench)
    else:
        rows, source = _from_histograms(evidence), f"{evidence.source}: vLLM's ITL histogram and counters"
    figures: list[Figure] = []
    for name, row in rows.items():
        figures.append(
            Figure("tokens_per_chunk", row["tokens_per_chunk"], "tokens", CHUNK_LINE, source, name)
        )
        figures.append(Figure("itl_per_chunk", _ms(row["itl_per_chunk"]), "ms", "", source, name))
        figures.append(Figure("itl_per_token", _ms(row["itl_per_token"]), "ms", "", source, name))
        figures.append(
            Figure("mean_acceptance_length", row["mean_acceptance_length"], "tokens", "", source, name)
        )
    overall = _overall(rows)
    tpc, chunk = overall.get("tokens_per_chunk"), overall.get("itl_per_chunk")
    if tpc is None or chunk is None:
        missing = (
            "no streamed chunks in the bench result" if evidence.bench is not None
            else "no inter-token latency observations in the window (vllm:inter_token_latency_seconds, "
            "vLLM >= 0.10.2) and no `--bench` result",
            *evidence.notes,
        )  # fmt: skip
        return Finding(
            CASE, TITLE, Verdict.UNKNOWN, "not enough data: no chunk timings", tuple(figures), (), missing
        )
    mal = overall.get("mean_acceptance_length")
    interval = chunk / tpc
    together = "all" if len(rows) > 1 else ""
    figures.append(
        Figure(
            "smoothing_interval", interval * 1000, "ms", "ITL per chunk / tokens per chunk", source, together
        )
    )
    figures.append(Figure("expected_burst", mal, "tokens", "the mean acceptance length", source, together))
    details: dict[str, object] = {"overall": overall, "source": source}
    if tpc < SUSPECT:
        return Finding(CASE, TITLE, Verdict.FINE,
                       f"chunks carry {tpc:.2f} tokens on average: streams are not bursty",
                       tuple(figures), (), evidence.notes, details)  # fmt: skip
    beyond = mal is not None and tpc > BEYOND_MAL * mal
    burst = (
        f"chunks carry {tpc:.2f} tokens on average, one every {chunk * 1000:.1f} ms "
        f"({interval * 1000:.1f} ms per token)"
    )
    if mal is None:
        cause = "; no acceptance data to tell whether speculation explains it"
    elif beyond:
        cause = (
            f"; speculation explains chunks of {mal:.2f} tokens (MAL): the rest were joined after the engine "
            "(the API server under load, a proxy buffering, the client reading late)"
        )
    else:
        cause = f": speculative decoding, whose steps emit {mal:.2f} tokens on average (MAL)"
    remedy: tuple[str, ...] = (
        f"smooth on the client: buffer each chunk and release one token every {interval * 1000:.1f} ms "
        f"(ITL per chunk {chunk * 1000:.1f} ms / {tpc:.2f} tokens per chunk); the text then flows at the "
        f"same rate, each token at most {(tpc - 1) * interval * 1000:.0f} ms later on average",
        "re-measure after a change of k or draft: the burst is the mean acceptance length, the interval the "
        "time per token",
    )
    if beyond:
        remedy = (
            *remedy,
            "look for buffering between vLLM and the client (proxy_buffering off for SSE in nginx)",
        )
    verdict = Verdict.CAUSE_FOUND if tpc >= BURSTY and mal is not None and not beyond else Verdict.SUSPECT
    return Finding(CASE, TITLE, verdict, burst + cause, tuple(figures), remedy, evidence.notes, details)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
