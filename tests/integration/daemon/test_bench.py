"""`specguard bench` against the simulator, whose ground truth (GET /sim/ground-truth) gives each
request's true tokens, TTFT and TPOT, and vLLM's spec-decode counters: the benchmark's figures
match it, at k = 5 with high acceptance where counting chunks would undercount tokens five-fold.
Then the A/B run, the baseline file, and each kind of bad input."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import statistics
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specguard.playbook.bench.baseline import BaselineWriteError, entry, write
from specguard.playbook.bench.load import Load
from specguard.playbook.bench.prompts import Prompt
from specguard.playbook.bench.runner import BenchError, Options, bench
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.store.baseline import parse_baseline
from tests.processes import specguard

PROMPTS = [Prompt("chat", f"Tell me something about the number {i}.") for i in range(6)] + [
    Prompt("code", f"Write a function that returns {i} squared.") for i in range(6)
]


async def simulator(k: int | None, step: float = 0.1, acceptance: float = 0.9) -> Simulator:
    speculative = SpeculativeConfig("draft_model", "tiny-draft", k) if k else None
    return await start_simulator(
        SimOptions(
            port=0,
            speculative=speculative,
            acceptance_by_position=[acceptance],
            step_time=step,
            draft_cost=0.1,
            seed=11,
        )
    )


@pytest.fixture
async def spec() -> AsyncIterator[Simulator]:
    sim = await simulator(5)
    yield sim
    await sim.stop()


async def truth(url: str) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url + "/sim/ground-truth") as answer:
        return {r["id"]: r for r in await answer.json()}


def options(url: str, **extra: Any) -> Options:
    return Options(
        url=url, prompts=PROMPTS, load=Load(concurrency=2, warmup=1, seed=3), max_tokens=40, **extra
    )


def quick(url: str, against: str) -> Options:
    """Fewer and shorter requests: a plain server takes a step per token."""
    return Options(
        url=url,
        prompts=PROMPTS[:3] + PROMPTS[6:9],
        load=Load(concurrency=3, warmup=0, seed=3),
        max_tokens=32,
        against=against,
    )


async def test_the_figures_match_the_servers_ground_truth_at_k_5(spec: Simulator) -> None:
    report = await bench(options(spec.url))
    records = await truth(spec.url)
    assert not report["partial"] and list(report["phases"]) == ["chat", "code"]
    results = [r for phase in report["phases"].values() for r in phase["results"]]
    assert len(results) == 12 and all(r.ok for r in results)
    ttft, true_ttft, tpot, true_tpot, e2e, true_e2e = [], [], [], [], [], []
    for result in results:
        record = records[result.response_id]
        assert result.output_tokens == record["completion_tokens"] == 40  # from usage, exactly
        assert result.prompt_tokens == record["prompt_tokens"]
        # chunks carry ~ the mean acceptance length each: counting them would be far off
        assert len(result.gaps) + 1 <= record["completion_tokens"] / 3
        assert sum(result.gap_tokens) + record["steps"][0]["tokens"] == record["completion_tokens"]
        ttft.append(result.ttft)
        true_ttft.append(record["first_token_time"] - record["arrival_time"])
        tpot.append(result.tpot)
        true_tpot.append(
            (record["finished_time"] - record["first_token_time"]) / (record["completion_tokens"] - 1)
        )
        e2e.append(result.e2e)
        true_e2e.append(record["finished_time"] - record["arrival_time"])
    for measured, true in ((ttft, true_ttft), (tpot, true_tpot), (e2e, true_e2e)):
        # 2 %, or 15 ms on a loaded machine: the client's own event loop, waiting for a core while
        # the other tests' servers run, adds its wait to a time it measures (once 7 ms on 0.29 s)
        assert statistics.median(measured) == pytest.approx(statistics.median(true), rel=0.02, abs=0.015)
        # a mean takes in every hiccup of a loaded machine's event loop; the median does not
        assert statistics.mean(measured) == pytest.approx(statistics.mean(true), rel=0.05)

    # acceptance for exactly the run, from /metrics before and after, against the ground truth;
    # vLLM's e2e histogram counted exactly the phase's requests (not the warm-up's), and its exact
    # mean (sum / count) is theirs
    for klass, phase in report["phases"].items():
        mine = [records[r.response_id] for r in phase["results"]]
        assert "server_note" not in phase, phase["server_note"]
        true_mean = statistics.mean(r["finished_time"] - r["arrival_time"] for r in mine)
        assert phase["server"]["e2e_latency_mean"] == pytest.approx(true_mean, rel=1e-6), klass
        accepted = sum(s["accepted"] for r in mine for s in r["steps"])
        drafted = sum(s["draft_tokens"] for r in mine for s in r["steps"])
        drafts = sum(1 for r in mine for s in r["steps"] if s["draft_tokens"])
        got = phase["acceptance"]
        assert got["rate"] == pytest.approx(accepted / drafted), klass
        assert got["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts), klass
        assert len(got["per_position"]) == 5 and got["per_position"][0] > got["per_position"][4]
    assert report["server"]["draft_positions"] == 5


async def test_against_a_server_without_speculation_gives_the_speedup_and_the_drafts_cost(
    spec: Simulator,
) -> None:
    plain = await simulator(None, step=0.1)
    try:
        report = await bench(quick(spec.url, plain.url))
    finally:
        await plain.stop()
    assert report["against"]["draft_positions"] == 0
    for klass in ("chat", "code"):
        row = report["comparison"][klass]
        assert row["gains"] and row["tpot_speedup"] > 2.5, row  # ~ MAL / (1 + 5 c) = 4.7 / 1.5
        assert row["draft_cost"] == pytest.approx(0.1, abs=0.02), row  # the simulator's c
    # the baseline says what speculation bought: the plain server's figures and the speedup
    made = entry(report, "draft_model", "2026-12-03T10:00:00Z")
    plain = made["without_speculation"]
    assert plain["vllm_version"] == "0.32.0"
    assert plain["signals"] == report["against"]["overall"]["server"]
    assert plain["client"] == report["against"]["overall"]["client"]
    assert plain["speedup"]["tpot"] == pytest.approx(plain["client"]["tpot_p50"] / made["client"]["tpot_p50"])
    assert (
        plain["speedup"]["tpot"] > 2.5 and plain["signals"]["tpot_mean"] > 2.5 * made["signals"]["tpot_mean"]
    )
    assert parse_baseline({"version": 2, "measured_at": "2026-12-03T10:00:00Z", "entries": [made]})


async def test_a_collapsed_acceptance_shows_as_a_loss(tmp_path: Path) -> None:
    poor, plain = await simulator(5, step=0.03, acceptance=0.05), await simulator(None, step=0.03)
    try:
        report = await bench(quick(poor.url, plain.url))
    finally:
        await poor.stop()
        await plain.stop()
    assert all(not row["gains"] for row in report["comparison"].values()), report["comparison"]


async def test_the_baseline_is_written_per_model_and_read_by_the_daemon(
    spec: Simulator, tmp_path: Path
) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"version": 2, "measured_at": "2026-11-01T00:00:00Z", "entries": [
        {"model": "other-model", "signals": {"e2e_latency_p95": 9.0}},
        {"model": "tiny-llama", "signals": {"e2e_latency_p95": 99.0}},
    ]}))  # fmt: skip
    report = await bench(options(spec.url))
    said = write(path, entry(report, "draft_model", "2026-12-03T10:00:00Z"), "2026-12-03T10:00:00Z")
    assert said.endswith("replaced the entry for model tiny-llama (2 entries)")
    written = json.loads(path.read_text())
    other, mine = written["entries"]
    assert other == {"model": "other-model", "signals": {"e2e_latency_p95": 9.0}}
    e2e = sorted(r.e2e for p in report["phases"].values() for r in p["results"])
    # the client's figures beside; the signals are vLLM's histograms, as the rules compute them
    assert mine["client"]["e2e_latency_p95"] == pytest.approx(
        statistics.quantiles(e2e, n=100, method="inclusive")[94]
    )
    assert mine["signals_from"] == "vllm_metrics"
    assert mine["signals"] == report["overall"]["server"]
    assert set(mine["signals"]) == {
        "e2e_latency_p50", "e2e_latency_p95", "e2e_latency_p99", "e2e_latency_mean", "ttft_p95", "itl_p50",
        "itl_p95", "tpot_p50", "tpot_p95", "tpot_mean", "generation_throughput",
    }  # fmt: skip
    assert set(mine["client"]) == {
        "e2e_latency_p50", "e2e_latency_p95", "e2e_latency_p99", "e2e_latency_mean", "ttft_p95", "itl_p50",
        "itl_p95", "tpot_p50", "tpot_p95", "tpot_mean", "output_throughput",
    }  # fmt: skip
    records = await truth(spec.url)
    answered = [records[r.response_id] for p in report["phases"].values() for r in p["results"]]
    true_mean = statistics.mean(r["finished_time"] - r["arrival_time"] for r in answered)
    assert mine["signals"]["e2e_latency_mean"] == pytest.approx(true_mean, rel=1e-6)
    assert mine["vllm_version"] == "0.32.0" and mine["speculative"] == {"method": "draft_model"}
    assert "12 requests, concurrency 2" in mine["measured_with"]
    baseline = parse_baseline(written)
    assert (
        baseline.value({"model_name": "tiny-llama"}, "e2e_latency_p95") == mine["signals"]["e2e_latency_p95"]
    )

    path.write_text('{"version": 2, "entries": [}')
    with pytest.raises(BaselineWriteError, match=r"baseline.json:1: not JSON .*; not overwritten"):
        write(path, entry(report, None, "2026-12-03T10:00:00Z"), "2026-12-03T10:00:00Z")
    assert path.read_text() == '{"version": 2, "entries": [}'


async def test_a_server_that_is_not_there_or_lacks_the_model_is_said_plainly(
    spec: Simulator, unused_tcp_port: int
) -> None:
    with pytest.raises(
        BenchError, match=r"nothing answers at http://127.0.0.1:\d+ .* wait until its /health answers"
    ):
        await bench(options(f"http://127.0.0.1:{unused_tcp_port}"))
    with pytest.raises(BenchError, match="does not serve 'llama-70b'; it serves tiny-llama"):
        await bench(options(spec.url, model="llama-70b"))


async def broken_server(mode: str) -> web.AppRunner:
    """A server that speaks just enough of vLLM's API to be benchmarked, then fails its requests:
    ``4xx`` refuses each, ``cut`` closes the stream half-way."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny-llama", "max_model_len": 4096}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        if mode == "4xx":
            return web.json_response({"error": {"message": "max_tokens is too large"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if mode == "no-usage":  # a server that ignores stream_options.include_usage
            for text in ("a", "b"):
                chunk = {"id": "x", "choices": [{"text": text}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return response
        # tokens that decode to no text yet (a tiny model's bytes, say): output all the same
        if mode == "no-text":
            for n in (1, 3, 8):
                chunk = {
                    "id": "x",
                    "choices": [{"text": ""}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n},
                }
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return response
        chunk = {
            "id": "x",
            "choices": [{"text": "one"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        assert request.transport is not None
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize(
    ("mode", "kind", "why"),
    [
        ("4xx", "http_4xx", "HTTP 400: max_tokens is too large"),
        ("cut", "cut", ""),
        ("no-usage", "bad_stream", "the server sent no usage (stream_options.include_usage)"),
    ],
)
async def test_failed_requests_are_counted_by_kind_and_no_baseline_is_written(
    mode: str, kind: str, why: str, tmp_path: Path
) -> None:
    runner = await broken_server(mode)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        code, out, err = await specguard(
            "bench", "--url", url, "--classes", "chat", "--num-prompts", "5", "--warmup", "0",
            "--write-baseline", str(tmp_path / "baseline.json"),
        )  # fmt: skip
    finally:
        await runner.cleanup()
    assert code == 1, (out, err)
    assert re.search(r"^chat +0/5 ", out, re.M) and f"chat: 5 {kind} error(s), e.g. {why}" in out, out
    assert "not writing" in err and "--allow-partial writes it anyway" in err
    assert not (tmp_path / "baseline.json").exists()
    assert "Traceback" not in out + err


async def test_bad_command_lines_and_prompt_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 5}\n')
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--prompts", str(bad))
    assert code == 2 and f"{bad}:2" in err and "prompt" in err, err
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--classes", "poetry")
    assert code == 2 and "poetry" in err and "chat" in err, err
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--concurrency", "0")
    assert code == 2 and "must be at least 1" in err
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--duration", "soon")
    assert (code == 2 and "--duration" not in err) or "invalid duration" in err, err
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--max-concurrency", "2")
    assert code == 2 and "--max-concurrency goes with --request-rate" in err
    code, _, err = await specguard("bench", "--url", "http://127.0.0.1:9", "--num-prompts", "2")
    assert code == 1 and "nothing answers at http://127.0.0.1:9" in err and "Traceback" not in err


async def test_the_command_prints_the_table_and_json(spec: Simulator) -> None:
    code, out, err = await specguard("bench", "--url", spec.url, "--classes", "code", "--num-prompts", "4",
                                     "--max-tokens", "16", "--json")  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["phases"]["code"]["summary"]["completed"] == 4
    assert report["phases"]["code"]["acceptance"]["mean_acceptance_length"] > 3
    code, out, err = await specguard("bench", "--url", spec.url, "--classes", "code", "--num-prompts", "4",
                                     "--max-tokens", "16", "--request-rate", "20", "--burstiness", "0.5")  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[0].endswith("model tiny-llama  vLLM 0.32.0  k=5")
    assert out.splitlines()[3].startswith("code   4/4")


def test_open_loop_arrivals_follow_the_rate(tmp_path: Path) -> None:
    from specguard.playbook.bench.load import run

    sent: list[float] = []

    async def send(prompt: Prompt) -> Any:
        sent.append(asyncio.get_running_loop().time())
        from specguard.playbook.bench.client import Result

        return Result(prompt.klass, 0.0, ok=True)

    results, _ = asyncio.run(run(Load(request_rate=50.0, num_prompts=200, seed=5), PROMPTS, send))
    assert len(results) == 200
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.25)  # Poisson arrivals at 50/s


async def test_check_shows_the_baseline_entries_the_rules_read(spec: Simulator, tmp_path: Path) -> None:
    code, _, err = await specguard("bench", "--url", spec.url, "--classes", "code", "--num-prompts", "4",
                                   "--max-tokens", "16", "--write-baseline", str(tmp_path / "baseline.json"),
                                   "--method", "draft_model")  # fmt: skip
    assert code == 0 and "added the entry for model tiny-llama (1 entry)" in err, err
    written = json.loads((tmp_path / "baseline.json").read_text())["entries"][0]
    (tmp_path / "specguard.yaml").write_text("baseline: baseline.json\nrules: [builtin:speculative]\n")
    code, out, err = await specguard("check", "--config", str(tmp_path / "specguard.yaml"))
    assert code == 0, err
    # histogram figures: nothing to warn of but the draft's cost, which draft_model has no default of
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "estimated_speedup needs the draft's cost per step" in warned[0], err
    p95 = written["signals"]["e2e_latency_p95"]
    assert f"  latency_regression: model tiny-llama: e2e_latency_p95 = {p95:.4g}, measured " in out, out
    # draft_model has no default cost: the A/B run measures it; without one, check says so
    assert "  speculation_unprofitable: model tiny-llama: no draft cost" in out, out


async def test_a_server_without_metrics_or_tokenize_is_benchmarked_and_said_so(tmp_path: Path) -> None:
    runner = await broken_server("no-text")  # answers well, has no /metrics and no /tokenize
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        code, out, err = await specguard(
            "bench", "--url", url, "--classes", "chat", "--num-prompts", "3", "--warmup", "0",
            "--write-baseline", str(tmp_path / "baseline.json"),
        )  # fmt: skip
    finally:
        await runner.cleanup()
    assert code == 0, err
    assert (
        f"prompts not checked against max_model_len 4096: {url} has no /tokenize; longer ones will fail"
        in err
    )
    assert "vLLM's /metrics gave no latency histograms" in out
    assert "the baseline holds client figures only (under `client`), which no rule compares with" in err
    written = json.loads((tmp_path / "baseline.json").read_text())["entries"][0]
    assert written["signals"] == {} and "signals_from" not in written and written["client"]["tpot_p50"] > 0


async def test_tokens_without_text_are_output_all_the_same() -> None:
    runner = await broken_server("no-text")
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        report = await bench(Options(url=url, prompts=PROMPTS[:2], load=Load(concurrency=1), max_tokens=8))
    finally:
        await runner.cleanup()
    results = report["phases"]["chat"]["results"]
    assert [(r.ok, r.output_tokens, r.gap_tokens) for r in results] == [(True, 8, [2, 5])] * 2


async def test_ctrl_c_reports_what_was_measured_and_writes_no_baseline(
    spec: Simulator, tmp_path: Path
) -> None:
    # Ten minutes of load: the run cannot end on its own before the interrupt, however fast the machine.
    argv = ["specguard", "bench", "--url", spec.url, "--classes", "chat", "--max-tokens", "40", "--duration", "10m",
            "--concurrency", "2", "--warmup", "0", "--write-baseline", str(tmp_path / "baseline.json")]  # fmt: skip
    # Ctrl-C at a terminal: SIGINT at its default. A test run started in the background of a shell
    # without job control (`make test &` in a script) passes SIGINT on ignored, and Python then
    # leaves it ignored: bench would never see this interrupt.
    at_a_terminal = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = {argv!r}; runpy.run_module('specguard', run_name='__main__')"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "faulthandler", "-c", at_a_terminal,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    truth_url = spec.url + "/sim/ground-truth"
    async with aiohttp.ClientSession() as session:
        for _ in range(300):  # until some requests are answered (0.1 s steps: about 1 s each)
            async with session.get(truth_url) as answer:
                if len([r for r in await answer.json() if r["finished_time"]]) >= 4:
                    break
            await asyncio.sleep(0.1)
    process.send_signal(signal.SIGINT)
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:  # the interrupt was not taken: show where every thread of bench stood
        process.send_signal(signal.SIGABRT)  # faulthandler writes each thread's stack to stderr
        await asyncio.wait_for(process.wait(), 30)
        stacks = (await process.stderr.read()).decode() if process.stderr else ""
        raise AssertionError(
            f"bench did not exit within 60 s of its SIGINT; its stacks:\n{stacks[-8000:]}"
        ) from None
    assert process.returncode == 130, err
    row = re.search(r"^chat +(\d+)/(\d+) ", out.decode(), re.M)
    assert row and int(row[1]) >= 4 and row[1] == row[2], out.decode()  # the answered ones, all measured
    assert (
        "interrupted: the figures above are of the requests answered so far; no baseline written"
        in err.decode()
    )
    assert not (tmp_path / "baseline.json").exists() and b"Traceback" not in err


async def test_the_chat_api_is_measured_the_same_way(spec: Simulator) -> None:
    report = await bench(
        Options(url=spec.url, prompts=PROMPTS[:4], load=Load(concurrency=2), api="chat", max_tokens=20)
    )
    records = await truth(spec.url)
    results = report["phases"]["chat"]["results"]
    assert len(results) == 4 and all(r.ok for r in results), [r.error for r in results]
    measured, true = [], []
    for result in results:
        record = records[result.response_id]
        assert result.output_tokens == record["completion_tokens"] == 20
        measured.append(result.ttft)
        true.append(record["first_token_time"] - record["arrival_time"])
    # a role-only first chunk carries no output: TTFT is the first token's
    assert statistics.median(measured) == pytest.approx(statistics.median(true), rel=0.05)


async def test_on_its_defaults_against_the_default_simulator_the_prompts_that_cannot_fit_are_left_out() -> (
    None
):
    # The simulator's context is 1,024 tokens: long_context's documents (1,800+ tokens) cannot run.
    sim = await simulator(3, step=0.002)
    try:
        code, out, err = await specguard("bench", "--url", sim.url, "--num-prompts", "10", "--max-tokens", "8",
                                         "--warmup", "0", "--json")  # fmt: skip
        named_code, _, named_err = await specguard(
            "bench",
            "--url",
            sim.url,
            "--classes",
            "chat,long_context",
            "--num-prompts",
            "4",
            "--max-tokens",
            "8",
        )
    finally:
        await sim.stop()
    assert code == 0, err
    (note,) = [line for line in err.splitlines() if "left out" in line]
    assert note == (
        "specguard bench: left out 10 prompt(s) that cannot fit max_model_len 1024 with their output "
        "(--max-tokens 8): long_context (all 10: not run)"
    )
    report = json.loads(out)
    # --num-prompts counts in all, as vllm bench serve does: 10 shared among the 4 classes that run
    counts = {klass: phase["summary"]["requests"] for klass, phase in report["phases"].items()}
    assert counts == {"chat": 3, "code": 3, "summarization": 2, "multilingual": 2}
    assert all(p["summary"]["completed"] == p["summary"]["requests"] for p in report["phases"].values())
    assert report["left_out"] == {"long_context": 10} and report["server"]["max_model_len"] == 1024
    # a class asked for by name that cannot run is a mistake: said, and nothing is run
    assert named_code == 1 and "Traceback" not in named_err
    assert named_err.strip().splitlines()[-1] == (
        "specguard bench: class long_context cannot run: none of its 10 prompts fits max_model_len 1024 with "
        "--max-tokens 8 (the shortest has 1836 prompt tokens); serve a longer context (vLLM's --max-model-len), "
        "lower --max-tokens, or leave long_context out of --classes"
    )


async def test_help_says_num_prompts_counts_in_all_and_duration_per_class() -> None:
    code, out, _ = await specguard("bench", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert (
        "--num-prompts N requests in all, shared evenly among the classes, as vllm bench serve counts them"
        in text
    )
    assert "--duration DURATION measured time of each class (each phase)" in text


async def test_too_few_prompts_for_the_classes_is_refused(spec: Simulator) -> None:
    code, _, err = await specguard("bench", "--url", spec.url, "--classes", "chat,code", "--num-prompts", "1")
    assert code == 1 and "Traceback" not in err
    assert "--num-prompts 1 counts requests in all, and 2 classes run (chat, code): give at least 2" in err
