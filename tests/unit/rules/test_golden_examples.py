"""The golden examples of tests/examples/: each timeline replayed through the daemon's own rounds,
dispatcher, guards, actions and store on a fake clock, and compared with its expected.yaml
(``SPECGUARD_REGOLD=1`` rewrites those instead: check the diff by hand)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests import examples_replay as replay


@pytest.mark.parametrize("example", replay.examples(), ids=lambda p: p.name)
async def test_the_example_replays_as_expected(example: Path, tmp_path: Path) -> None:
    replay.check(example, await replay.replay(example, tmp_path))


async def test_a_wrong_expectation_is_reported_as_a_mismatch_with_a_diff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECGUARD_REGOLD", raising=False)
    example = tmp_path / "01_threshold_below"
    shutil.copytree(replay.EXAMPLES / example.name, example)
    right = (example / "expected.yaml").read_text()
    # The page a minute late, and the resolution's message worded as a breach.
    wrong = right.replace("done: 3m}", "done: 4m}").replace(">= 0.5 on", "< 0.5 on")
    assert wrong != right
    (example / "expected.yaml").write_text(wrong)
    actual = await replay.replay(example, tmp_path / "work")
    with pytest.raises(pytest.fail.Exception) as failed:
        replay.check(example, actual)
    said = str(failed.value)
    assert "01_threshold_below: the replay disagrees with expected.yaml" in said
    assert "-  - {action: log, status: ok, detail: logged at warning, done: 4m}" in said
    assert "+  - {action: log, status: ok, detail: logged at warning, done: 3m}" in said
    assert "-  message: 'acceptance_rate 0.5 < 0.5 on" in said
    assert "+  message: 'acceptance_rate 0.5 >= 0.5 on" in said
    (example / "expected.yaml").write_text(right)
    replay.check(example, actual)  # and the right one passes


def test_every_example_is_complete_and_numbered_in_order() -> None:
    examples = replay.examples()
    assert len(examples) >= 22
    for number, example in enumerate(examples, 1):
        assert re.fullmatch(rf"{number:02d}_[a-z0-9_]+", example.name), example.name
        readme = (example / "README.md").read_text().strip().splitlines()
        assert 2 <= len(readme) <= 6, f"{example.name}/README.md: {len(readme)} lines"
        assert (example / "expected.yaml").is_file(), example.name
        assert (example / "timeline.yaml").is_file(), example.name
        config = example / "config.yaml"
        named = yaml.safe_load(config.read_text()).get("rules", []) if config.exists() else ["rules.yaml"]
        assert (example / "rules.yaml").is_file() or named == ["builtin:speculative"], example.name
