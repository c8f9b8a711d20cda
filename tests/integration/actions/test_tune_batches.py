"""`specguard tune --concurrency`: a k per batch size, measured on a simulator whose decode turns
compute-bound as batches grow, managed by a real daemon's vllm_restart action (in a file of its own:
each of the two sweeps takes a minute and a half, and a file goes to one test worker whole)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from specguard.playbook.serve_config.serving import load_serving
from specguard.playbook.tune.batches import schedule
from tests.processes import specguard
from tests.tune_sim import (
    BATCH_SWEEP,
    BATCHED,
    LEVELS,
    ORIGINAL,
    TuneHost,
    ladder,
    ready,
    sections,
    true_acceptance_length,
    true_batch_best,
    true_batch_speedup,
    tune_kept,
)


async def test_a_concurrency_sweep_writes_a_k_per_batch_size_that_falls_as_batches_grow(
    tmp_path: Path,
) -> None:
    """On a simulator whose decode turns compute-bound as batches grow, the best k at concurrency 2
    is 3 and at 8 is 1 (tests/tune_sim.py, by about 36 % and 28 %); tune measures both levels,
    recommends a schedule that falls, and --write puts it in the serving file with the k that caps
    it (vLLM caps each range's k at num_speculative_tokens), a file serve-config renders."""
    low, high = LEVELS
    assert (true_batch_best(low), true_batch_best(high)) == (3, 1)
    assert true_batch_speedup(3, low) > 1.3 * true_batch_speedup(1, low)
    assert true_batch_speedup(1, high) > 1.2 * true_batch_speedup(3, high)
    served = TuneHost(tmp_path, sim=BATCHED)
    served.start()
    try:
        await ready(served)
        serving_before = served.serving.read_text()
        started = time.monotonic()
        code, out, err = await specguard(
            "tune", "--config", str(served.config), "--url", served.host.url,
            "--sweep", ",".join(map(str, BATCH_SWEEP)), "--concurrency", ",".join(map(str, LEVELS)),
            "--classes", "chat", "--num-prompts", "24", "--max-tokens", "96",
            "--serving", str(served.serving), "--write", "--settle", "0", cwd=served.root, timeout=600,
        )  # fmt: skip
        (served.root / "tune-batches.txt").write_text(out + err)
        print(f"tune over concurrency {LEVELS} in {time.monotonic() - started:.0f}s:\n{out}\n{err}")
        assert code == 0, (out, err)
        tables = sections(out)
        assert sorted(tables) == sorted(LEVELS), out
        for level, found in tables.items():
            assert [r["k"] for r in found] == ["off", *map(str, BATCH_SWEEP)], out
            best = true_batch_best(level)
            assert f"  best measured k at concurrency {level}: {best}\n" in out, out
            for r in found[1:]:  # the server ran each k: its mean acceptance length is the model's
                assert float(r["mal"]) == pytest.approx(true_acceptance_length(int(r["k"])), rel=0.05), out
        expected = schedule({level: true_batch_best(level) for level in LEVELS})
        assert expected[0][2] > expected[-1][2]  # the k falls as batches grow
        said = re.search(r"^recommended: num_speculative_tokens_per_batch_size = (\S+) ", out, re.M)
        assert said is not None and json.loads(said.group(1)) == expected, out

        written = served.serving.read_text()
        loaded = load_serving(served.serving)
        top = max(row[2] for row in expected)
        assert loaded.num_speculative_tokens == top
        assert [list(row) for row in loaded.num_speculative_tokens_per_batch_size or ()] == expected
        assert written == serving_before.replace(
            f"num_speculative_tokens: {ORIGINAL}   # k", f"num_speculative_tokens: {top}   # k"
        ) + "num_speculative_tokens_per_batch_size:\n" + "".join(f"- {row}\n" for row in expected)
        assert f"serving: {served.serving}: num_speculative_tokens {ORIGINAL} -> {top}" in err, err
        code, rendered, rerr = await specguard("serve-config", str(served.serving), "--vllm-version", "0.32.0",
                                               "--format", "json", cwd=served.root)  # fmt: skip
        assert code == 0, rerr
        config = json.loads(rendered)["speculative_config"]
        assert config["num_speculative_tokens"] == top, rendered
        assert config["num_speculative_tokens_per_batch_size"] == expected, rendered

        shown = await ladder(served)
        assert shown["k"] == ORIGINAL == shown["file_k"] and shown["change"] is None
        assert [(e["from"], e["to"]) for e in shown["log"]] == [(4, 3), (3, 1), (1, 0), (0, 4)]
        (kept,) = await tune_kept(served)  # the k the serving file got, and its schedule
        assert kept.recommended == top and kept.result["schedule"] == expected
    finally:
        served.stop()
