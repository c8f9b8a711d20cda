"""`specguard diagnose` on the simulator's scenarios, end to end: a simulated vLLM serves traffic,
its /metrics is scraped and recorded into the store's history as the daemon records it, and the
command, in its own process, reads that history and answers. A costly draft (its c measured by
`specguard bench --against` into the baseline), KV-cache pressure, a temperature collapse and
speculative bursts (from history and from a bench result) each come out with the right verdict,
cause and numbers."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from specguard.metrics.speedup import best_k
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.scenario import KvRamp, Scenario, TimelineEvent
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.traffic import Traffic
from specguard.sources.scrape import ScrapeSource
from specguard.store.database import Store
from specguard.store.history import record
from tests.processes import specguard

SECONDS = 8.0  # of traffic recorded into history for each scenario


def options(k: int | None, acceptance: float = 0.8, **more: Any) -> SimOptions:
    speculative = SpeculativeConfig("draft_model", "tiny-draft", k) if k else None
    return SimOptions(port=0, speculative=speculative, acceptance_by_position=[acceptance],
                      step_time=0.01, seed=5, **more)  # fmt: skip


async def recorded(sim: Simulator, state: Path, temperature: float = 0.0, seconds: float = SECONDS) -> None:
    """Traffic on ``sim`` for ``seconds``, its /metrics scraped every second into history."""
    traffic = Traffic(sim.url, sim.options.model, concurrency=4, max_tokens=48, temperature=temperature)
    source = ScrapeSource([sim.url + "/metrics"], timeout=5.0, retention=60.0)
    store = Store(state / "specguard.db")
    await store.open()
    await traffic.start()
    try:
        ends = time.monotonic() + seconds
        while True:
            await source.refresh()
            await store.call(functools.partial(record, scrapes=source.latest()))
            if time.monotonic() >= ends:
                break
            await asyncio.sleep(1.0)
    finally:
        await traffic.stop()
        await source.close()
        await store.close()
    assert traffic.stats.requests > 10 and not source.last_errors


def config(tmp_path: Path, baseline: dict[str, Any] | Path | None = None) -> Path:
    lines = [f"state_dir: {tmp_path / 'state'}"]
    if isinstance(baseline, dict):
        path = tmp_path / "baseline.json"
        path.write_text(
            json.dumps({"version": 2, "measured_at": "2026-12-01T00:00:00Z", "entries": [baseline]})
        )
        lines.append(f"baseline: {path}")
    elif baseline is not None:
        lines.append(f"baseline: {baseline}")
    out = tmp_path / "specguard.yaml"
    out.write_text("\n".join(lines) + "\n")
    return out


async def diagnose(cfg: Path, *cases: str, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, Any]]:
    code, out, err = await specguard("diagnose", "--config", str(cfg), "--since", "10m", "--json",
                                     "--case", *cases, *extra)  # fmt: skip
    assert code != 2, err
    return code, json.loads(out)


def figure(case: dict[str, Any], name: str) -> Any:
    values = [f["value"] for f in case["figures"] if f["name"] == name]
    assert len(values) == 1, (name, case["figures"])
    return values[0]


def source_of(case: dict[str, Any], name: str) -> str:
    return str(next(f["source"] for f in case["figures"] if f["name"] == name))


async def test_a_costly_draft_measured_by_bench_against(tmp_path: Path) -> None:
    spec = await start_simulator(options(5, acceptance=0.7, draft_cost=0.6))
    plain = await start_simulator(options(None))
    try:
        baseline = tmp_path / "baseline.json"
        code, _, err = await specguard(
            "bench", "--url", spec.url, "--against", plain.url, "--classes", "chat", "--num-prompts", "8",
            "--max-tokens", "32", "--write-baseline", str(baseline), "--method", "draft_model",
        )  # fmt: skip
        assert code == 0, err
        await recorded(spec, tmp_path / "state")
    finally:
        await spec.stop()
        await plain.stop()
    code, out = await diagnose(config(tmp_path, baseline), "1")
    (case,) = out["cases"]
    assert code == 1 and case["verdict"] == "cause found", case["summary"]
    assert "the draft costs too much" in case["summary"] and "acceptance" not in case["summary"]
    # the simulator's acceptance and its draft's cost, as measured
    assert figure(case, "alpha_hat") == pytest.approx(0.7, abs=0.05)
    assert figure(case, "k") == 5
    cost = figure(case, "draft_cost")
    assert cost == pytest.approx(0.6, abs=0.15)
    assert "measured by `specguard bench --against`" in source_of(case, "draft_cost")
    speedup = figure(case, "estimated_speedup")
    assert speedup == pytest.approx(figure(case, "mean_acceptance_length") / (1 + 5 * cost), rel=1e-6)
    assert speedup < 1
    best = next(line for line in case["details"]["k_table"] if "best" in line)
    best_k_value, best_speedup = int(best.split()[2].rstrip(":")), float(best.split()[4])
    if best_speedup >= 1:
        assert any(f"lower k from 5 to {best_k_value}" in step for step in case["remedy"])
    else:
        assert any("no k pays" in step for step in case["remedy"])
    assert best_k([0.7 ** (i + 1) for i in range(5)], cost).k == best_k_value


async def test_kv_cache_pressure(tmp_path: Path) -> None:
    ramp = Scenario(timeline=[TimelineEvent(at=1.0, kv_usage=KvRamp(to=0.98, over=2.0))])
    sim = await start_simulator(options(3, acceptance=0.8, scenario=ramp))
    try:
        await recorded(sim, tmp_path / "state")
    finally:
        await sim.stop()
    code, out = await diagnose(config(tmp_path, {"speculative": {"method": "eagle3"}}), "1")
    (case,) = out["cases"]
    assert code == 1 and case["verdict"] == "cause found"
    assert "KV-cache pressure" in case["summary"] and "peaked at 98 %" in case["summary"]
    assert "acceptance" not in case["summary"] and "draft costs" not in case["summary"]
    assert figure(case, "kv_cache_usage_peak") == pytest.approx(98.0)
    assert figure(case, "estimated_speedup") > 1
    assert any("--max-num-seqs" in step for step in case["remedy"])


async def test_a_temperature_collapse_names_acceptance(tmp_path: Path) -> None:
    sim = await start_simulator(options(3, acceptance=0.8, temperature_decay=1.5))
    try:
        await recorded(sim, tmp_path / "state", temperature=1.5)
    finally:
        await sim.stop()
    code, out = await diagnose(config(tmp_path, {"speculative": {"method": "eagle3"}}), "1")
    (case,) = out["cases"]
    # acceptance at T = 1.5: 0.8 * exp(-1.5 * 1.5) = 0.084
    assert code == 1 and case["verdict"] == "cause found" and "acceptance collapsed" in case["summary"]
    assert figure(case, "alpha_hat") == pytest.approx(0.8 * 2.718281828**-2.25, abs=0.04)
    assert any("change the draft" in step for step in case["remedy"])


async def test_speculative_bursts_from_history_and_from_a_bench_result(tmp_path: Path) -> None:
    sim = await start_simulator(options(4, acceptance=0.9))
    try:
        await recorded(sim, tmp_path / "state")
        code, bench_out, err = await specguard(
            "bench", "--url", sim.url, "--classes", "chat", "--num-prompts", "8", "--max-tokens", "48", "--json"
        )  # fmt: skip
        assert code == 0, err
    finally:
        await sim.stop()
    cfg = config(tmp_path)
    code, out = await diagnose(cfg, "3")
    (case,) = out["cases"]
    assert code == 1 and case["verdict"] == "cause found", case["summary"]
    tpc, mal = figure(case, "tokens_per_chunk"), figure(case, "mean_acceptance_length")
    # a chunk is a step: it carries the mean acceptance length (a request's last step, cut short by
    # max_tokens, carries fewer)
    assert 1.5 <= tpc <= mal * 1.02 and tpc == pytest.approx(mal, rel=0.15)
    assert figure(case, "smoothing_interval") == pytest.approx(figure(case, "itl_per_chunk") / tpc, rel=1e-6)
    assert figure(case, "itl_per_token") == pytest.approx(figure(case, "itl_per_chunk") / tpc, rel=1e-6)
    assert f"release one token every {figure(case, 'smoothing_interval'):.1f} ms" in case["remedy"][0]

    bench_file = tmp_path / "bench.json"
    bench_file.write_text(bench_out)
    bench = json.loads(bench_out)["phases"]["chat"]
    code, out = await diagnose(cfg, "3", extra=("--bench", str(bench_file)))
    (case,) = out["cases"]
    assert code == 1 and case["verdict"] == "cause found"
    assert figure(case, "tokens_per_chunk") == pytest.approx(bench["summary"]["tokens_per_chunk"])
    assert figure(case, "itl_per_chunk") == pytest.approx(bench["summary"]["itl"]["mean"] * 1000)
    assert figure(case, "mean_acceptance_length") == pytest.approx(
        bench["acceptance"]["mean_acceptance_length"]
    )
    assert "bench --json" in source_of(case, "tokens_per_chunk")
