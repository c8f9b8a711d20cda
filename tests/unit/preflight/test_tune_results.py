"""What `specguard tune` keeps of a finished sweep (tune_results) and what preflight reads of it: the
k to run, the k within the sweep's margin (its tie), the newest result per server and model."""

from __future__ import annotations

from pathlib import Path

from specguard.config.loading import load
from specguard.playbook.tune.measure import Figures, Run
from specguard.playbook.tune.record import result, save
from specguard.playbook.tune.verdict import TIE, Verdict, decide
from specguard.preflight.item import Context, Status
from specguard.preflight.items import tuning
from specguard.preflight.servers import ServerFacts
from specguard.store import tune_results
from specguard.store.database import opened
from specguard.store.tune_results import TuneResult


def run(k: int, concurrency: int, tpot: float) -> Run:
    figures = Figures(10, 10, (None, None), (None, None), (None, None), None, tpot, None)
    return Run(k, concurrency, {"chat": figures}, "0.32.0", k, {"server": {"model": "llama"}})


def test_a_sweep_is_kept_with_the_k_within_its_margin() -> None:
    # k = 3 is fastest; k = 5 is 0.5 % slower (a tie: within the margin), k = 1 is 20 % slower
    runs = {1: {4: run(1, 4, 0.0060)}, 3: {4: run(3, 4, 0.0050)}, 5: {4: run(5, 4, 0.005025)}}
    made = decide(Verdict((1, 3, 5), (4,), runs, {}, {}))
    kept = result(made, "http://admin:hunter2@10.0.0.7:8000/", original=4, now=1000.0)
    assert (kept.url, kept.model, kept.k_running, kept.recommended, kept.margin) == (
        "http://10.0.0.7:8000", "llama", 4, 3, TIE,
    )  # fmt: skip
    assert kept.result["within_margin"] == [3, 5] and kept.acceptable() == (3, 5)
    assert kept.result["ks"] == [1, 3, 5] and kept.result["schedule"] is None
    assert "hunter2" not in repr(kept)  # the URL as preflight shows it


async def test_preflight_holds_the_running_k_to_the_margin(tmp_path: Path) -> None:
    path = tmp_path / "state" / "specguard.db"
    await save_fresh(
        path, TuneResult(100.0, "http://10.0.0.7:8000", "llama", 4, 3, TIE, {"within_margin": [3, 5]})
    )
    ctx = Context(loaded=load(None), config_file=None, store_file=path, now=200.0)
    ctx.cache["servers"] = [facts("http://10.0.0.7:8000", 5)]
    answer = await tuning.check(ctx)
    assert (
        answer.status is Status.PASS
        and answer.evidence[-1] == "  runs k=5: within the margin of the recommended k"
    )
    ctx.cache["servers"] = [
        facts("http://10.0.0.9:8000", 4)
    ]  # another server of the model: its result stands
    answer = await tuning.check(ctx)
    assert answer.status is Status.FAIL and "on http://10.0.0.7:8000" in answer.evidence[1]
    assert answer.evidence[2] == "  runs k=4, not the recommended k=3 (nor within its margin)"
    ctx.cache["servers"] = [facts("http://10.0.0.9:8000", 0)]  # nothing speculates
    answer = await tuning.check(ctx)
    assert (
        answer.status is Status.FAIL
        and answer.evidence[-1] == "no configured server runs speculative decoding"
    )


def facts(url: str, k: int) -> ServerFacts:
    return ServerFacts(
        url + "/metrics", url, url.split("//")[1], "0.32.0", ("llama",), ("/models/llama",), k, ()
    )


async def save_fresh(path: Path, found: TuneResult) -> None:
    async with opened(path):
        pass
    await save(path, found)


def test_with_a_schedule_the_k_to_run_is_its_largest() -> None:
    runs = {1: {2: run(1, 2, 0.0058), 8: run(1, 8, 0.0089)}, 3: {2: run(3, 2, 0.0043), 8: run(3, 8, 0.0115)}}
    made = decide(Verdict((1, 3), (2, 8), runs, {}, {}))
    kept = result(made, "http://h:8000", original=3)
    assert made.schedule == [[1, 4, 3], [5, 8, 1]]
    assert kept.recommended == 3 and kept.result["schedule"] == [[1, 4, 3], [5, 8, 1]]


async def test_the_newest_result_of_each_server_and_model_is_read(tmp_path: Path) -> None:
    path = tmp_path / "specguard.db"
    async with opened(path):
        pass  # the daemon's database, as it leaves it
    older = TuneResult(100.0, "http://a:8000", "llama", 4, 3, TIE, {"within_margin": [3]})
    newer = TuneResult(200.0, "http://a:8000", "llama", 3, 1, TIE, {"within_margin": [1, 3]})
    other = TuneResult(150.0, "http://b:8000", "llama", 4, 5, None, {})
    for found in (older, newer, other):
        said = await save(path, found)
    assert said == f"recorded in {path} (tune_results): k=5 for llama at http://b:8000"
    async with opened(path) as store:
        latest = await store.call(tune_results.latest)
    assert latest == [newer, other]
    assert newer.acceptable() == (1, 3) and other.acceptable() == (5,)
