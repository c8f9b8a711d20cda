"""Every finished sweep is kept in the state database's ``tune_results`` (``store/tune_results.py``):
the k recommended, the k the server ran, and the k within the sweep's margin of the best, which
``specguard preflight`` holds the running server to."""

from __future__ import annotations

import time
from pathlib import Path

from specguard.common.redact import shown
from specguard.playbook.tune.verdict import TIE, Verdict
from specguard.store import tune_results
from specguard.store.database import opened
from specguard.store.tune_results import TuneResult


def result(verdict: Verdict, url: str, original: int, now: float | None = None) -> TuneResult:
    """What the sweep found, as a row: the k to run is the one ``--write`` puts in the serving file
    (the largest of the per-batch-size schedule when there is one)."""
    primary = verdict.primary
    scores = {k: verdict.score(k, primary) for k in verdict.ks}
    top = max(scores.values(), default=0.0)
    within = sorted(k for k, value in scores.items() if top and value >= top * (1 - TIE))
    table = verdict.schedule
    k = verdict.recommended if table is None else max(row[2] for row in table)
    first = verdict.runs[verdict.ks[-1]][primary]
    model = str(first.report.get("server", {}).get("model") or "")
    return TuneResult(
        at=time.time() if now is None else now,
        url=shown(url.rstrip("/")),  # as preflight shows it: no credentials
        model=model,
        k_running=original,
        recommended=k,
        margin=TIE,
        result={
            "ks": list(verdict.ks),
            "concurrency": list(verdict.concurrency),
            "primary": primary,
            "best": {str(c): best for c, best in verdict.best.items()},
            "scores": {str(key): value for key, value in scores.items()},
            "within_margin": within,
            "schedule": table,
            "predicted_best": verdict.predicted_best(),
            "vllm_version": verdict.version,
        },
    )


async def save(path: Path, found: TuneResult) -> str:
    """Add ``found`` to the state database at ``path`` (the daemon's, which may be running); what
    was done, for the command's output. Raises StoreError."""
    async with opened(path) as store:
        await store.call(lambda db: tune_results.record(db, found))
    return f"recorded in {path} (tune_results): k={found.recommended} for {found.model} at {found.url}"
