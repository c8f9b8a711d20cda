"""The baseline file the latency rules read, written from a benchmark run: the entry for the
benchmarked model replaced (the file's other entries kept), in version 2 of the format
(``store/baseline.py``). Its ``signals`` are vLLM's histograms read as the rules read them; what
the benchmark's client timed is kept beside them, for people, never compared with a rule's value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specguard.common.files import write_atomically
from specguard.store.baseline import parse_baseline


class BaselineWriteError(Exception):
    """The file cannot be updated; the message names it and why (it is left as it was)."""


def entry(report: dict[str, Any], method: str | None, measured_at: str) -> dict[str, Any]:
    """The baseline entry for the benchmarked model, from the run's overall figures (every phase's
    requests together): as ``signals``, what vLLM's ``/metrics`` gave, computed as the rules compute
    theirs; as ``client``, what the benchmark timed; with an A/B run, the plain server's figures and
    the speedup under ``without_speculation``, and the draft's cost."""
    server = report["server"]
    overall = report["overall"]
    count = sum(r.ok for phase in report["phases"].values() for r in phase["results"])
    load = report["load"]
    shape = (
        f"concurrency {load['concurrency']}"
        if load["request_rate"] is None
        else f"{load['request_rate']:g} requests/s"
    )
    made: dict[str, Any] = {"model": server["model"], "signals": dict(overall["server"])}
    if made["signals"]:
        made["signals_from"] = "vllm_metrics"
    made["client"] = dict(overall["client"])
    against = report.get("against")
    if against is not None:
        plain = against["overall"]
        speedup = {
            name: plain["client"][figure] / overall["client"][figure]
            for name, figure in (("tpot", "tpot_p50"), ("e2e", "e2e_latency_p50"))
            if plain["client"].get(figure) and overall["client"].get(figure)
        }
        made["without_speculation"] = {
            "vllm_version": against["vllm_version"],
            "signals": dict(plain["server"]),
            "client": dict(plain["client"]),
            "speedup": speedup,
        }
    made["measured_at"] = measured_at
    made["measured_with"] = (
        f"specguard bench: {count} requests, {shape}, {report['api']}, max_tokens {report['max_tokens']}, "
        f"temperature {report['temperature']:g}; classes " + ", ".join(report["phases"])
    )
    made["vllm_version"] = server["vllm_version"]
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
