"""The verification cost that grows with the batch (--verify-token-cost): a step is memory-bound
until the tokens it verifies, running * (k + 1), cost more than reading the weights and the KV
caches; then every drafted token verified costs its share, so the best k falls as batches grow."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from specguard.sim.cli import parse_options
from specguard.sim.model import step_seconds
from specguard.sim.options import OptionsError, SimOptions
from tests.sim.simclient import decode_step_costs, speculative, steps_alone_and_together

ROOT = Path(__file__).resolve().parents[2]


def old_formula(
    step: float, k: int, c: float, slowdown: float, running: int, prefill: int, per_step: int
) -> float:
    """The step cost before the option existed, written out."""
    return step * (1 + k * c) * (1 + slowdown * max(running - 1, 0)) + step * prefill / per_step


def test_without_a_verify_cost_the_step_is_what_it_was() -> None:
    grid = itertools.product((0.002, 0.01, 0.02), (0, 1, 3, 5), (0.0, 0.05, 0.25), (0.0, 0.01, 0.5),
                             (1, 2, 8, 64), (0, 100, 4096))  # fmt: skip
    for step, k, c, slowdown, running, prefill in grid:
        expected = old_formula(step, k, c, slowdown, running, prefill, 512)
        assert step_seconds(step, k, c, slowdown, running, prefill, 512) == expected
        assert step_seconds(step, k, c, slowdown, running, prefill, 512, 0.0) == expected
    assert SimOptions().verify_token_cost == 0.0


def test_a_verify_cost_below_the_memory_bound_step_changes_nothing() -> None:
    # 2 running x (3 + 1) tokens x 0.1 = 0.8 of a step: still memory-bound (1.01)
    assert step_seconds(0.01, 3, 0.1, 0.01, 2, 0, 512, 0.1) == old_formula(0.01, 3, 0.1, 0.01, 2, 0, 512)


def test_once_compute_bound_the_step_grows_with_running_times_k() -> None:
    t, c, slowdown = 0.1, 0.1, 0.01

    def cost(k: int, running: int) -> float:
        return step_seconds(0.01, k, c, slowdown, running, 0, 512, t)

    # 8 running x (3 + 1) x 0.1 = 3.2 steps of compute, plus 3 draft steps at c over the batch's 1.07
    assert cost(3, 8) == pytest.approx(0.01 * (3.2 + 3 * 0.1 * 1.07))
    for running in (16, 32, 64):  # each extra drafted token costs t of a step per running request
        extra_token = cost(4, running) - cost(3, running)
        assert extra_token == pytest.approx(0.01 * (t * running + c * (1 + slowdown * (running - 1))))
    for k in (1, 3, 5):  # ... and each extra running request t per token it verifies
        assert cost(k, 33) - cost(k, 32) == pytest.approx(0.01 * (t * (k + 1) + k * c * slowdown))
    # what speculation is worth falls with the batch: k = 3 makes 1 + 2.05 tokens where k = 1 makes 1.9
    gain = {n: (3.05 / cost(3, n)) / (1.9 / cost(1, n)) for n in (1, 2, 8, 32, 1024)}
    assert gain[1] == pytest.approx(gain[2]) and gain[1] > 1.3 and gain[8] < 0.9 and gain[32] < 0.9
    # fully compute-bound, tokens per step over tokens verified: (3.05 / 4) / (1.9 / 2)
    assert gain[1024] == pytest.approx((3.05 / 4) / (1.9 / 2), rel=0.01)
    # plain decoding too becomes compute-bound at 1 / t requests and more
    assert cost(0, 10) == pytest.approx(0.01 * 1.09) and cost(0, 20) == pytest.approx(0.01 * 2.0)


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_a_bad_verify_cost_is_refused(value: float) -> None:
    with pytest.raises(OptionsError, match=r"^verify token cost must be >= 0$"):
        SimOptions(verify_token_cost=value)


def test_the_option_from_the_command_line_and_the_config_file(tmp_path: Path) -> None:
    assert parse_options(["--verify-token-cost", "0.05"]).verify_token_cost == 0.05
    path = tmp_path / "vllm.yaml"
    path.write_text("port: 9000\nverify-token-cost: 0.02\n")
    assert parse_options(["--config", str(path)]).verify_token_cost == 0.02
    assert parse_options(["--config", str(path), "--verify-token-cost", "0.1"]).verify_token_cost == 0.1
    path.write_text("port: 9000\nverify-token-cost: lots\n")
    with pytest.raises(OptionsError, match=rf"^{path}:2: verify-token-cost: "):
        parse_options(["--config", str(path)])
    path.write_text("verify_token_cost: -1\n")
    with pytest.raises(OptionsError, match=r"^verify token cost must be >= 0$"):
        parse_options(["--config", str(path)])


def test_the_command_refuses_a_negative_cost_in_one_line_and_explains_the_option() -> None:
    def sim(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "specguard.sim", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip

    bad = sim("--verify-token-cost", "-1")
    assert (bad.returncode, bad.stdout, bad.stderr) == (
        2,
        "",
        "specguard simulate: verify token cost must be >= 0\n",
    )
    helped = sim("--help")
    assert helped.returncode == 0 and "--verify-token-cost F" in helped.stdout
    assert "compute-bound" in helped.stdout


async def test_the_engine_charges_each_step_what_the_model_says() -> None:
    """The cost the ground truth records for every decode step, alone and with three running."""
    options = SimOptions(port=0, step_time=0.005, speculative=speculative(3), draft_cost=0.1,
                         batch_slowdown=0.0, verify_token_cost=0.2, seed=3)  # fmt: skip
    costs = decode_step_costs(await steps_alone_and_together(options, max_tokens=30))
    # alone: 1 x 4 x 0.2 = 0.8 < 1, memory-bound: 5 ms x (1 + 3 x 0.1) = 6.5 ms; with 3 running:
    # 3 x 4 x 0.2 = 2.4 steps of compute + 0.3 of drafting = 13.5 ms (2 running: 1.6 + 0.3)
    assert costs <= {(1, 0.0065), (2, 0.0095), (3, 0.0135)}, costs
    assert {(1, 0.0065), (3, 0.0135)} <= costs
