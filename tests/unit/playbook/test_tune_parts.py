"""The pure parts of `specguard tune`: the sweep's order, the per-batch-size schedule, the serving
file's check and in-place update, the recommendation's tie rule, the progress line's ETA."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from specguard.playbook.tune import write
from specguard.playbook.tune.batches import schedule, supported
from specguard.playbook.tune.daemon import Ladder
from specguard.playbook.tune.measure import Figures, Run
from specguard.playbook.tune.progress import TuneProgress
from specguard.playbook.tune.sweep import TuneError, plan
from specguard.playbook.tune.verdict import Verdict, decide


def ladder(k: int, rungs: tuple[int, ...] = (5, 4, 3, 1, 0)) -> Ladder:
    return Ladder("shrink", k, rungs, "/etc/vllm.yaml", None)


def test_the_sweep_measures_the_running_k_first_then_down_from_the_largest_then_the_reference() -> None:
    made = plan(ladder(3), (1, 3, 5), (4,), rung_reference=True)
    assert made.order == (3, 5, 1, 0) and made.ks == (1, 3, 5)
    assert made.restarts == 4  # 3 -> 5 -> 1 -> 0 -> 3
    assert plan(ladder(4), (5, 1), (4,), rung_reference=False).order == (5, 1)
    assert plan(ladder(4), (5, 1), (4,), rung_reference=False).restarts == 3  # 4 -> 5 -> 1 -> 4
    assert plan(ladder(0), (1, 3), (4,), rung_reference=True).order == (0, 3, 1)


def test_a_sweep_value_the_ladder_cannot_reach_is_named() -> None:
    with pytest.raises(
        TuneError, match=r"k=2, 6 are not on the ladder \[5, 4, 3, 1, 0\] of vllm_restart action"
    ):
        plan(ladder(3), (2, 3, 6), (4,), rung_reference=True)
    with pytest.raises(TuneError, match="> 0"):
        plan(ladder(3), (0, 3), (4,), rung_reference=True)


def test_the_schedule_splits_at_geometric_midpoints_starts_at_1_and_merges_equal_k() -> None:
    assert schedule({1: 5, 4: 3, 16: 1}) == [[1, 2, 5], [3, 8, 3], [9, 16, 1]]
    assert schedule({1: 5, 4: 5, 16: 2}) == [[1, 8, 5], [9, 16, 2]]
    assert schedule({2: 4}) == [[1, 2, 4]]
    assert schedule({1: 3, 2: 2}) == [[1, 1, 3], [2, 2, 2]]


def test_the_schedule_is_for_vllm_0_25_and_later() -> None:
    assert supported("0.25.0") and supported("0.32.0") and supported("1.0.1")
    assert not supported("0.24.1") and not supported(None) and not supported("dev")


SERVING = """\
# serving.yaml: what serve-config reads
target: /models/llama   # the target
method: ngram
num_speculative_tokens: 4       # k
speculative_extra:
  prompt_lookup_max: 4
extra_args: ["--enable-prefix-caching"]
"""


def test_the_serving_file_gets_k_and_the_schedule_in_place(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text(SERVING)
    said = write.update(path, 3, [[1, 2, 5], [3, 16, 3]])
    assert (
        said
        == f"{path}: num_speculative_tokens 4 -> 3, num_speculative_tokens_per_batch_size [[1,2,5],[3,16,3]]"
    )
    assert path.read_text() == SERVING.replace(
        "num_speculative_tokens: 4       # k", "num_speculative_tokens: 3       # k"
    ) + ("num_speculative_tokens_per_batch_size:\n- [1, 2, 5]\n- [3, 16, 3]\n")
    write.update(path, 5, None)  # no schedule recommended: the one there is left as it is
    assert "num_speculative_tokens: 5       # k" in path.read_text()
    assert "- [3, 16, 3]" in path.read_text()
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left, no copy beside


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", ":1: the serving file must be a mapping of keys"),
        ("target: x\nmethod: ngram\n", ":1: num_speculative_tokens: Field required"),
        ("target: x\nmethod: ngram\nnum_speculative_tokens: 0\n", ":3: num_speculative_tokens: Input should be greater than 0"),
        ("target: x\nmethod: ngram\nnum_speculative_tokens: true\n", ":3: num_speculative_tokens: Input should be a valid integer"),
        ("target: x\nmethod: ngram\nnum_speculative_tokens: 3\nnum_speculative_tokens_per_batch_size: [[1, 2]]\n",
         ":4: num_speculative_tokens_per_batch_size[0][2]: Field required"),
        ("target: x\nmethod: ngram\nnum_speculative_tokens: 3\nnum_speculative_tokens_per_batch_size: [[2, 4, 3]]\n",
         ":4: num_speculative_tokens_per_batch_size: the first range must start at batch size 1"),
        ("target: x\nmethod: draft_model\nnum_speculative_tokens: 3\n", ":2: method: method draft_model needs `draft`"),
        ("num_speculative_tokens: [3\n", ":2: invalid YAML"),
    ],
)  # fmt: skip
def test_a_bad_serving_file_is_refused_naming_the_line_and_left_as_it_was(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text(text)
    with pytest.raises(write.ServingFileError, match=f"^{path}") as caught:
        write.update(path, 3, None)
    assert f"{path}{message}" in str(caught.value)
    assert path.read_text() == text


def test_a_schedule_vllm_would_refuse_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text(SERVING)
    with pytest.raises(write.ServingFileError, match="the ranges overlap"):
        write.update(path, 5, [[1, 4, 5], [3, 16, 3]])
    assert path.read_text() == SERVING


def run(k: int, tpot: dict[str, float]) -> Run:
    def figures(value: float) -> Figures:
        return Figures(10, 10, (None, None), (None, None), (None, None), None, value, None)

    return Run(k, 4, {klass: figures(value) for klass, value in tpot.items()}, "0.32.0", k, {})


def test_the_best_k_is_the_fastest_over_the_classes_and_a_tie_goes_to_the_smaller_k() -> None:
    runs = {
        1: {4: run(1, {"chat": 0.010, "code": 0.010})},
        3: {4: run(3, {"chat": 0.008, "code": 0.0081})},
        5: {4: run(5, {"chat": 0.0080, "code": 0.0080})},  # under 1 % faster than k = 3: a tie
    }
    verdict = decide(Verdict((1, 3, 5), (4,), runs, {4: run(0, {"chat": 0.02, "code": 0.02})}, {}))
    assert verdict.recommended == 3
    assert verdict.measured(3, 4, "chat") == pytest.approx(2.5)
    assert verdict.schedule is None  # one concurrency level


def test_the_eta_comes_from_the_phases_timed_so_far() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = TuneProgress(out, restarts=2, measurements=3, restart_guess=60, clock=lambda: now[0])
    progress.say("k 4 -> 5")
    assert out.getvalue() == "specguard tune: [1/5] k 4 -> 5 (0s so far)\n"  # a measurement's time unknown
    now[0] = 50.0
    progress.restarted(50.0)
    progress.measured(20.0)
    progress.say("measuring k=5")
    # one restart left at 50 s, two measurements at 20 s
    assert out.getvalue().splitlines()[-1] == "specguard tune: [2/5] measuring k=5 (50s so far, ETA 1m30s)"


def test_a_concurrency_sweep_on_vllm_0_25_or_later_gives_the_per_batch_size_schedule() -> None:
    runs = {
        1: {1: run(1, {"chat": 0.010}), 16: run(1, {"chat": 0.020})},
        5: {1: run(5, {"chat": 0.005}), 16: run(5, {"chat": 0.030})},
    }
    verdict = decide(Verdict((1, 5), (1, 16), runs, {}, {}))
    assert verdict.best == {1: 5, 16: 1} and verdict.recommended == 5
    assert verdict.schedule == [[1, 4, 5], [5, 16, 1]]
    old = {k: {c: Run(r.k, c, r.classes, "0.24.0", r.k, {}) for c, r in by.items()} for k, by in runs.items()}
    assert decide(Verdict((1, 5), (1, 16), old, {}, {})).schedule is None
