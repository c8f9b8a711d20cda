"""One k measured: ``specguard bench``'s run (its ``runner.bench``, called, not shelled out) at each
concurrency, reduced to the sweep's figures per traffic class.

The measured speedup compares decoding speed, so it is taken from the time per output token pooled
over every answered request of a class (the sum of ``e2e - TTFT`` over the sum of ``output tokens -
1``): token-weighted, it varies far less from run to run than a median of per-request TPOTs, whose
requests each see only a few dozen draft steps. When a run's streams arrived in bursts (the front
end or the client held up, several steps' chunks at once: ``stats.burst_share``), e2e - TTFT no
longer times the decoding; the whole request's time per output token (``pooled_e2e``) still does,
prefill included."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specguard.playbook.bench import runner
from specguard.playbook.bench.client import Result
from specguard.playbook.bench.runner import BenchError, Options
from specguard.playbook.bench.stats import BURSTY_SHARE, burst_share


@dataclass
class Figures:
    """One class at one k and one concurrency."""

    requests: int
    completed: int
    ttft: tuple[float | None, float | None]  # p50, p95 (s)
    tpot: tuple[float | None, float | None]
    e2e: tuple[float | None, float | None]
    output_throughput: float | None  # tokens/s
    pooled_tpot: float | None  # s per output token after the first, every request pooled
    itl_p50: float | None  # the median gap between chunks: one engine step
    pooled_e2e: float | None = None  # s per output token, the whole request, every request pooled
    burst_share: float | None = None  # the share of chunk gaps too short to be engine steps
    acceptance: float | None = None
    mean_acceptance_length: float | None = None
    per_position: list[float] = field(default_factory=list)
    drafts: float = 0.0


@dataclass
class Run:
    """One bench run at one k and concurrency: each class's figures, and what the server said."""

    k: int
    concurrency: int
    classes: dict[str, Figures]
    vllm_version: str | None
    draft_positions: int  # what /metrics counted: k as the server runs it
    report: dict[str, Any]  # bench's own report (for the baseline)

    def bursts(self) -> dict[str, float]:
        """The classes whose streams arrived in bursts, with the share of their gaps too short."""
        return {
            klass: f.burst_share
            for klass, f in self.classes.items()
            if f.burst_share is not None and f.burst_share > BURSTY_SHARE
        }

    @property
    def failed(self) -> int:
        return sum(f.requests - f.completed for f in self.classes.values())


def pooled_tpot(results: Sequence[Result]) -> float | None:
    seconds = sum(r.e2e - r.ttft for r in results if r.ok and r.e2e is not None and r.ttft is not None)
    tokens = sum(r.output_tokens - 1 for r in results if r.ok and r.e2e is not None and r.ttft is not None)
    return seconds / tokens if tokens > 0 else None


def pooled_e2e(results: Sequence[Result]) -> float | None:
    done = [r for r in results if r.ok and r.e2e is not None]
    tokens = sum(r.output_tokens for r in done)
    return sum(r.e2e for r in done if r.e2e is not None) / tokens if tokens > 0 else None


def figures(phase: dict[str, Any]) -> Figures:
    s, a = phase["summary"], phase["acceptance"] or {}
    return Figures(
        requests=s["requests"],
        completed=s["completed"],
        ttft=(s["ttft"]["p50"], s["ttft"]["p95"]),
        tpot=(s["tpot"]["p50"], s["tpot"]["p95"]),
        e2e=(s["e2e"]["p50"], s["e2e"]["p95"]),
        output_throughput=s["output_throughput"],
        pooled_tpot=pooled_tpot(phase["results"]),
        itl_p50=s["itl"]["p50"],
        pooled_e2e=pooled_e2e(phase["results"]),
        burst_share=burst_share(phase["results"]),
        acceptance=a.get("rate"),
        mean_acceptance_length=a.get("mean_acceptance_length"),
        per_position=list(a.get("per_position", [])),
        drafts=float(a.get("drafts", 0.0)),
    )


async def measure(options: Options, k: int, concurrency: int, progress: runner.Progress | None) -> Run:
    """Bench the server as it runs now (at ``k``) at ``concurrency``. Raises BenchError when the
    server cannot be benchmarked (it does not answer)."""
    report = await runner.bench(
        replace(options, load=replace(options.load, concurrency=concurrency)), progress
    )
    server = report["server"]
    return Run(
        k=k,
        concurrency=concurrency,
        classes={klass: figures(phase) for klass, phase in report["phases"].items()},
        vllm_version=server["vllm_version"],
        draft_positions=int(server["draft_positions"]),
        report=report,
    )


def draft_cost(spec: Run, plain: Run) -> dict[str, float]:
    """c per class from a run at k > 0 and one without speculation, as ``bench --against`` finds it
    (``runner.compare``: a streamed chunk is one engine step, (1 + k c) times the plain one)."""

    def server(run: Run) -> runner.Server:
        shown = run.report["server"]
        made = runner.Server(shown["url"], shown["model"], shown["vllm_version"], shown["max_model_len"])
        made.positions, made.phases = run.draft_positions, run.report["phases"]
        return made

    compared = runner.compare(server(spec), server(plain))  # none from streams that came in bursts
    return {klass: row["draft_cost"] for klass, row in compared.items() if "draft_cost" in row}


__all__ = ["BenchError", "Figures", "Run", "draft_cost", "figures", "measure", "pooled_e2e", "pooled_tpot"]
