"""The sweep's table as the operator reads it: per concurrency and class, each k's acceptance, mean
acceptance length, latencies, throughput, and its measured speedup against the predicted one; then
the recommendation, the per-batch-size schedule, and each class's predicted k table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from specguard.metrics.ktable import fmt
from specguard.playbook.bench.stats import BURST_GAP
from specguard.playbook.tune.measure import Figures
from specguard.playbook.tune.verdict import Verdict

HEADER = ("CLASS", "K", "ACCEPT", "MAL", "TTFT p50/p95 ms", "TPOT p50/p95 ms", "E2E p50/p95 s", "TOK/S",
          "SPEEDUP", "PREDICTED")  # fmt: skip


def _ms(pair: tuple[float | None, float | None]) -> str:
    return "/".join("-" if v is None else f"{v * 1000:.1f}" for v in pair)


def _s(pair: tuple[float | None, float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.2f}" for v in pair)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _row(klass: str, k: str, f: Figures, measured: float | None, predicted: float | None) -> tuple[str, ...]:
    return (
        klass, k,
        "-" if f.acceptance is None else f"{f.acceptance:.2f}",
        "-" if f.mean_acceptance_length is None else f"{f.mean_acceptance_length:.2f}",
        _ms(f.ttft), _ms(f.tpot), _s(f.e2e),
        "-" if f.output_throughput is None else f"{f.output_throughput:.0f}",
        _x(measured), _x(predicted),
    )  # fmt: skip


def columns(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


def render(verdict: Verdict, out: TextIO) -> None:
    for concurrency in verdict.concurrency:
        out.write(f"concurrency {concurrency}\n")
        rows: list[tuple[str, ...]] = [HEADER]
        classes = list(verdict.runs[verdict.ks[-1]][concurrency].classes)
        for klass in classes:
            plain = verdict.reference.get(concurrency)
            if plain is not None and klass in plain.classes:
                same = 1.0 if concurrency == verdict.primary else None
                rows.append(_row(klass, "off", plain.classes[klass], 1.0, same))
            for k in verdict.ks:
                f = verdict.runs[k][concurrency].classes.get(klass)
                if f is not None:
                    rows.append(_row(klass, str(k), f, verdict.measured(k, concurrency, klass),
                                     verdict.predicted(k, klass, concurrency)))  # fmt: skip
        columns(rows, out)
        bursts = verdict.bursts(concurrency)
        if bursts:
            said = "; ".join(
                f"k={k} {klass} {share:.0%}" for k, found in bursts.items() for klass, share in found.items()
            )
            out.write(
                f"  streams that arrived in bursts (chunk gaps under {BURST_GAP * 1000:g} ms: {said}): their TPOT "
                "does not time the engine's steps, so SPEEDUP and the best k compare the whole request's time "
                "per output token (prefill included)\n"
            )
        out.write(f"  best measured k at concurrency {concurrency}: {verdict.best[concurrency]}\n")
        if concurrency != verdict.primary and verdict.predictions:
            out.write(f"  PREDICTED: at concurrency {verdict.primary} only, where p_i and c were measured\n")
        out.write("\n")
    if not verdict.reference:
        out.write(
            "SPEEDUP needs a run without speculation (rung 0 of the ladder, or --against): not measured\n"
        )
    predicted = verdict.predicted_best()
    line = f"recommended: num_speculative_tokens = {verdict.recommended} (measured best at concurrency {verdict.primary}"
    line += f"; predicted best of the sweep: {predicted})" if predicted is not None else ")"
    out.write(line + "\n")
    table = verdict.schedule
    if table is not None:
        out.write(
            "recommended: num_speculative_tokens_per_batch_size = "
            + str(table).replace(" ", "")
            + f" (batch sizes [start, end, k]; num_speculative_tokens caps them: set it to {max(r[2] for r in table)})\n"
        )
    elif len(verdict.concurrency) > 1:
        out.write(
            f"no num_speculative_tokens_per_batch_size: vLLM {verdict.version or '?'} has none (0.25 and later)\n"
        )
    for klass, prediction in verdict.predictions.items():
        where = f", concurrency {verdict.primary}" if len(verdict.concurrency) > 1 else ""
        out.write(f"\npredicted, {klass} (p_i measured at k = {prediction.measured_k}{where}):\n")
        for text in prediction.lines():
            out.write(f"  {text}\n")


def plain_text(verdict: Verdict) -> str:
    import io

    buffer = io.StringIO()
    render(verdict, buffer)
    return buffer.getvalue()


__all__ = ["columns", "fmt", "plain_text", "render"]
