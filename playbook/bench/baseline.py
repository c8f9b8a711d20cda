"""The baseline file the latency rules read, written from a benchmark run: the entry for the
benchmarked model replaced (the file's other entries kept), in version 2 of the format
(``daemon/baseline.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.files import write_atomically
from daemon.baseline import parse_baseline
from playbook.bench.stats import distribution

# What a run's figures become: the catalog's signals (client-side, which is what users see).
SIGNALS = {
    "e2e_latency_p50": ("e2e", "p50"),
    "e2e_latency_p95": ("e2e", "p95"),
    "e2e_latency_p99": ("e2e", "p99"),
    "ttft_p95": ("ttft", "p95"),
    "itl_p50": ("itl", "p50"),
    "itl_p95": ("itl", "p95"),
}


class BaselineWriteError(Exception):
    """The file cannot be updated; the message names it and why (it is left as it was)."""


def entry(report: dict[str, Any], method: str | None, measured_at: str) -> dict[str, Any]:
    """The baseline entry for the benchmarked model: the run's overall figures (every phase's
    requests together), the draft's cost from an A/B run when there was one."""
    results = [r for phase in report["phases"].values() for r in phase["results"] if r.ok]
    figures = {
        "e2e": distribution([r.e2e for r in results if r.e2e is not None]),
        "ttft": distribution([r.ttft for r in results if r.ttft is not None]),
        "itl": distribution([g for r in results for g in r.gaps]),
    }
    signals = {name: figures[kind][q] for name, (kind, q) in SIGNALS.items() if figures[kind][q] is not None}
    server = report["server"]
    load = report["load"]
    shape = (
        f"concurrency {load['concurrency']}"
        if load["request_rate"] is None
        else f"{load['request_rate']:g} requests/s"
    )
    made: dict[str, Any] = {
        "model": server["model"],
        "signals": signals,
        "measured_at": measured_at,
        "measured_with": f"specguard bench: {len(results)} requests, {shape}, {report['api']}, "
        f"max_tokens {report['max_tokens']}, temperature {report['temperature']:g}; classes "
        + ", ".join(report["phases"]),
        "vllm_version": server["vllm_version"],
    }
    speculative: dict[str, Any] = {}
    if method:
        speculative["method"] = method
    costs = [row["draft_cost"] for row in report.get("comparison", {}).values() if "draft_cost" in row]
    if costs:
        speculative["draft_cost"] = round(sorted(costs)[len(costs) // 2], 4)  # the median class's
    if speculative:
        made["speculative"] = speculative
    return made


def write(path: Path, made: dict[str, Any], measured_at: str) -> str:
    """Replace the entry for ``made``'s model (no instance) in ``path``, or start the file; returns
    what was done. Raises BaselineWriteError, leaving the file as it was."""
    entries: list[dict[str, Any]] = []
    if path.exists():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            parse_baseline(raw)
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineWriteError(f"{path}: cannot read it: {exc}") from None
        except json.JSONDecodeError as exc:
            raise BaselineWriteError(f"{path}:{exc.lineno}: not JSON ({exc.msg}); not overwritten") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise BaselineWriteError(f"{path}: {where}: {first['msg']}; not overwritten") from None
        if raw.get("version", 1) == 2:
            entries = list(raw["entries"])
        else:  # a version 1 file becomes its one entry
            entries = [{k: v for k, v in raw.items() if k in ("model", "signals", "speculative")}]
    kept = [e for e in entries if not (e.get("model") == made["model"] and e.get("instance") is None)]
    replaced = len(kept) < len(entries)
    document = {
        "version": 2,
        "measured_at": measured_at,
        "method": "specguard bench",
        "entries": [*kept, made],
    }
    parse_baseline(document)  # what the daemon will read
    try:
        write_atomically(path, json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise BaselineWriteError(f"{path}: cannot write it: {exc.strerror or exc}") from None
    verb = "replaced" if replaced else "added"
    count = len(kept) + 1
    return f"{path}: {verb} the entry for model {made['model']} ({count} entr{'y' if count == 1 else 'ies'})"
