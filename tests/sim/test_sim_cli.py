"""``python -m specguard.sim``: help, one-line errors with exit 2, and a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specguard.sim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_help_describes_the_options() -> None:
    result = sim("--help")
    assert result.returncode == 0
    for option in ("--speculative-config", "-sc", "--config", "--acceptance-by-position", "--scenario"):
        assert option in result.stdout


def test_bad_speculative_config_json_is_one_clear_line_and_exit_2() -> None:
    result = sim("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3')
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("specguard simulate: --speculative-config: invalid JSON")
    assert "Traceback" not in result.stderr


def test_a_bad_scenario_file_names_file_line_and_field_and_exits_2(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("timeline:\n  - at: 5s\n    acceptance: 2\n")
    result = sim("--scenario", str(scenario))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"specguard simulate: {scenario}:3: timeline[0].acceptance: ")
    missing = sim("--scenario", str(tmp_path / "nowhere.yaml"))
    assert missing.returncode == 2 and "cannot read file" in missing.stderr


def test_a_lifecycle_log_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = sim("--port", "0", "--lifecycle-log", str(tmp_path / "nowhere" / "lifecycle.jsonl"))
    assert result.returncode == 2
    assert result.stderr == (
        f"specguard simulate: --lifecycle-log: cannot write {tmp_path / 'nowhere' / 'lifecycle.jsonl'}: "
        "No such file or directory\n"
    )


def test_out_of_range_acceptance_is_an_argument_error() -> None:
    result = sim("--acceptance", "1.5")
    assert result.returncode == 2
    assert "--acceptance: expected a number in [0, 1], got '1.5'" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_it_serves_until_a_signal_and_then_exits_0(signum: signal.Signals) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specguard.sim", "--port", "0", "-sc", '{"method": "ngram", "num_speculative_tokens": 2}',
        cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    try:
        line = (await asyncio.wait_for(process.stderr.readline(), timeout=20)).decode()
        match = re.search(
            r"serving tiny-llama on (http://127\.0\.0\.1:\d+) \(speculative decoding, k=2\)", line
        )
        assert match, line
        async with aiohttp.ClientSession() as session, session.get(match[1] + "/health") as response:
            assert response.status == 200
        process.send_signal(signum)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        assert b"Traceback" not in await process.stderr.read()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_a_scenario_death_ends_the_process_with_exit_1(tmp_path: Path) -> None:
    scenario = tmp_path / "die.yaml"
    scenario.write_text("timeline:\n  - at: 0.2s\n    die: true\n")
    result = sim("--port", "0", "--scenario", str(scenario))
    assert result.returncode == 1
    assert "the simulated vLLM died (scenario `die`)" in result.stderr
