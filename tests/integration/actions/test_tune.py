"""`specguard tune` against the simulator managed by a real daemon's vllm_restart action: the
predicted speedup (from the per-position acceptance of one run at the largest k, and c measured
against the plain reference, rung 0) agrees with the measured one within 5 % at every k, the
recommendation is the simulator's true best, the original k is back at the end, the rules that
name the action were silenced (recorded), and --write updates the serving file in place and the
baseline.

The tolerance: the measured speedup is a ratio of two pooled times per output token measured on the
same machine minutes apart, so the machine's load divides out; what remains is sampling (each
class pools about 1,500 draft steps, so the mean acceptance length is within about 1.5 % and each
speedup within about 2 %), and the step cut short by max_tokens at the end of each request (about
1 % at 256 tokens), which the prediction leaves out. 5 % is above their sum. The true best k is
about 10 % ahead of the next, so noise cannot change the recommendation."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from specguard.actions.vllm_restart.server import Server, positions
from specguard.playbook.tune.verdict import TIE
from tests.processes import specguard
from tests.tune_sim import (
    ORIGINAL,
    SWEEP,
    TRUE_BEST,
    TuneHost,
    ladder,
    ready,
    rows,
    true_speedup,
    tune_kept,
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[TuneHost]:
    host = TuneHost(tmp_path)
    host.start()
    yield host
    host.stop()


async def test_the_sweep_predicts_measures_and_recommends_the_true_best_k(served: TuneHost) -> None:
    await ready(served)
    baseline = served.root / "baseline.json"
    serving_before = served.serving.read_text()
    code, out, err = await specguard(
        "tune", "--config", str(served.config), "--url", served.host.url, "--sweep", ",".join(map(str, SWEEP)),
        "--classes", "chat,code", "--num-prompts", "40", "--max-tokens", "256", "--concurrency", "4",
        "--serving", str(served.serving), "--baseline", str(baseline), "--write", "--settle", "0",
        cwd=served.root, timeout=900,
    )  # fmt: skip
    (served.root / "tune-table.txt").write_text(out)
    print(f"tune on the simulator:\n{out}\n{err}")
    assert code == 0, (out, err)
    found = rows(out)
    measured = {(r["klass"], r["k"]): float(r["measured"]) for r in found}
    predicted = {(r["klass"], r["k"]): float(r["predicted"]) for r in found}
    assert {k for _, k in measured} == {"off", *map(str, SWEEP)}
    for key, value in measured.items():
        if key[1] == "off":
            continue
        assert value == pytest.approx(predicted[key], rel=0.05), (key, value, predicted[key], out)
        assert value == pytest.approx(true_speedup(int(key[1])), rel=0.05), (key, value, out)
    assert f"recommended: num_speculative_tokens = {TRUE_BEST} " in out, out
    assert "predicted, chat (p_i measured at k = 5):" in out
    # the progress said where it was, with the time left
    assert re.search(r"\[\d+/\d+\] measuring k=\d at concurrency 4 \(\S+ so far, ETA \S+\)", err), err

    shown = await ladder(served)
    assert shown["k"] == ORIGINAL == shown["file_k"] and shown["change"] is None
    steps = [(e["from"], e["to"], e["ok"]) for e in shown["log"]]
    assert steps == [(4, 5, True), (5, 3, True), (3, 1, True), (1, 0, True), (0, 4, True)], steps
    assert all(e["reason"].startswith("by hand (specguard tune (") for e in shown["log"])

    code, listed, _ = await specguard("silence", "list", "--all", "--config", str(served.config),
                                      "--format", "json", cwd=served.root)  # fmt: skip
    silences = json.loads(listed)
    assert silences and all(s["rule"] == "acceptance_critical" for s in silences)
    assert all(s["reason"] == "specguard tune: sweeping k 1,3,5 on shrink" for s in silences)
    assert all(s["expired"] is not None for s in silences)  # --settle 0: none left once done

    written = served.serving.read_text()
    assert written == serving_before.replace(
        f"num_speculative_tokens: {ORIGINAL}   # k", f"num_speculative_tokens: {TRUE_BEST}   # k"
    )
    entries = json.loads(baseline.read_text())["entries"]
    assert [e["model"] for e in entries] == ["tiny-llama"]
    assert "signals" in entries[0] and entries[0]["vllm_version"]

    # kept for preflight (item 3): the k recommended, the k the server ran, the k within the margin
    kept = await tune_kept(served)
    assert len(kept) == 1, kept
    assert (kept[0].url, kept[0].model, kept[0].k_running) == (served.host.url, "tiny-llama", ORIGINAL)
    assert kept[0].recommended == TRUE_BEST and kept[0].margin == TIE
    assert kept[0].result["ks"] == list(SWEEP) and TRUE_BEST in kept[0].result["within_margin"]
    assert set(kept[0].result["scores"]) == {str(k) for k in SWEEP}
    assert f"recorded in {served.root / 'state' / 'specguard.db'} (tune_results): k={TRUE_BEST}" in err, err


def one_line(err: str) -> str:
    lines = [
        line for line in err.splitlines() if line.startswith("specguard tune: ") and "[" not in line[:20]
    ]
    errors = [
        line
        for line in lines
        if not line.startswith(("specguard tune: shrink: k=", "specguard tune: silencing"))
    ]
    assert len(errors) == 1, err
    assert "Traceback" not in err, err
    return errors[0]


async def test_k_of_zero_or_less_is_refused_before_anything(tmp_path: Path) -> None:
    for sweep in ("0,3", "-1", "a,3"):
        code, out, err = await specguard(
            "tune", "--url", "http://127.0.0.1:9", "--sweep", sweep, cwd=tmp_path
        )
        assert code == 2 and out == "", (out, err)
        assert err.count("\n") == 1 and err.startswith(f"specguard tune: --sweep '{sweep}': "), err


async def test_a_config_without_a_vllm_restart_action_is_refused(tmp_path: Path) -> None:
    host = TuneHost(tmp_path, action=False, rules="rules: []\n")
    code, _, err = await specguard("tune", "--config", str(host.config), "--url", host.host.url, "--sweep", "1",
                                   cwd=tmp_path)  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "has no vllm_restart action" in err, err


async def test_a_daemon_that_is_not_running_is_said_so(tmp_path: Path) -> None:
    host = TuneHost(tmp_path)  # nothing started
    code, _, err = await specguard("tune", "--config", str(host.config), "--url", host.host.url, "--sweep", "1",
                                   cwd=tmp_path)  # fmt: skip
    assert code == 2 and err.count("\n") == 1, err
    assert f"the daemon at http://127.0.0.1:{host.port} does not answer" in err, err


async def test_a_sweep_value_off_the_ladder_and_a_bad_serving_file_change_nothing(served: TuneHost) -> None:
    await ready(served)
    code, _, err = await specguard("tune", "--config", str(served.config), "--url", served.host.url,
                                   "--sweep", "2,3", cwd=served.root)  # fmt: skip
    assert code == 2, err
    assert one_line(err) == (
        "specguard tune: --sweep: k=2 is not on the ladder [5, 4, 3, 1, 0] of vllm_restart action shrink: the "
        "daemon steps to rungs only; sweep rungs, or add them to the ladder (and reload the daemon)"
    )
    served.serving.write_text("target: tiny-llama\nmethod: ngram\nnum_speculative_tokens: three\n")
    code, _, err = await specguard("tune", "--config", str(served.config), "--url", served.host.url, "--sweep", "3",
                                   "--serving", str(served.serving), "--write", cwd=served.root)  # fmt: skip
    assert code == 2, err
    assert one_line(err) == (
        f"specguard tune: {served.serving}:3: num_speculative_tokens: Input should be a valid integer"
    )
    served.serving.write_text("- a list\n")
    code, _, err = await specguard("tune", "--config", str(served.config), "--url", served.host.url, "--sweep", "3",
                                   "--serving", str(served.serving), "--write", cwd=served.root)  # fmt: skip
    assert code == 2 and "the serving file must be a mapping of keys" in one_line(err), err
    assert served.serving.read_text() == "- a list\n"
    shown = await ladder(served)
    assert shown["k"] == ORIGINAL and shown["log"] == []  # no restart was made


async def test_a_server_gone_mid_sweep_stops_it_and_the_original_k_is_restored(served: TuneHost) -> None:
    await ready(served)
    before = served.serving.read_text()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard", "tune", "--config", str(served.config), "--url", served.host.url,
        "--sweep", "3,5", "--classes", "chat", "--num-prompts", "400", "--max-tokens", "256",
        "--serving", str(served.serving), "--write", cwd=served.root,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    seen: list[str] = []
    async with asyncio.timeout(120):
        while not any("measuring k=5" in line for line in seen):
            seen.append((await process.stderr.readline()).decode())
    await asyncio.sleep(1)
    served.host.stop()  # the server goes away under the measurement
    async with asyncio.timeout(300):
        _, rest = await process.communicate()
    err = "".join(seen) + rest.decode()
    assert process.returncode == 2, err
    assert "Traceback" not in err
    failed = [line for line in err.splitlines() if "request(s) failed" in line]
    assert len(failed) == 1 and failed[0].endswith("; k=4 runs (the original: 4)"), err
    shown = await ladder(served)
    assert shown["k"] == ORIGINAL == shown["file_k"] and shown["change"] is None, shown
    assert [(e["from"], e["to"]) for e in shown["log"]] == [(4, 5), (5, 4)]
    assert served.serving.read_text() == before  # nothing written
    assert await tune_kept(served) == []  # an unfinished sweep recommends nothing


async def test_tune_and_the_daemon_killed_mid_sweep_leave_a_valid_k(served: TuneHost) -> None:
    await ready(served)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard", "tune", "--config", str(served.config), "--url", served.host.url,
        "--sweep", "1,3,5", "--classes", "chat", "--num-prompts", "20", cwd=served.root,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    killed_at = None
    async with asyncio.timeout(240):
        while killed_at is None:  # a restart under way: the daemon's journal open at verify
            change = (await ladder(served))["change"]
            if change is not None and change["phase"] == "verify":
                process.kill()
                served.daemon.stop(signal.SIGKILL)
                killed_at = time.time()
    await process.wait()
    assert (await ladder(served))["change"] is not None  # the journal says a change was cut short

    served.daemon.start()
    async with asyncio.timeout(120):
        while (shown := await ladder(served))["change"] is not None:
            await asyncio.sleep(0.5)
    k = shown["k"]
    assert k in (5, 4, 3, 1) and shown["file_k"] == k, shown  # a rung, and the file vLLM reads says it
    async with aiohttp.ClientSession() as session:
        await Server(served.host.url, None).wait_healthy(30)
        async with session.get(served.host.url + "/metrics") as answer:
            assert positions(await answer.text())[1] == set(range(k))  # the server runs it
    code, listed, err = await specguard("silence", "list", "--config", str(served.config), "--format", "json",
                                      cwd=served.root)  # fmt: skip
    assert code == 0, err
    # the sweep's silence, left by the kill, ends by itself within a step's time (the action's
    # timeout, 30 minutes by default, plus 10)
    assert all(s["ends"] <= killed_at + 1800 + 600 + 5 for s in json.loads(listed)), listed
