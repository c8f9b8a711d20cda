"""`specguard preflight`'s command line: bad input is one line and exit 2, before anything runs; the
exit code is 0 only when every item passes (or is unknown, with --allow unknown); --out writes the
Markdown record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specguard.cli.entry import main
from specguard.preflight import run as runner
from specguard.preflight.item import Status
from tests.unit.preflight.fakes import answering, item


@pytest.fixture
def items(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    chosen: list[object] = [
        item(1, "baseline", answering(Status.PASS, "fresh")),
        item(2, "compat", answering(Status.PASS, "fits")),
    ]
    monkeypatch.setattr(runner, "ITEMS", chosen)
    return chosen


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "specguard.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return path


def test_every_item_passing_exits_0(
    items: list[object], config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["preflight", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert " 1. the baseline item  PASS" in out and out.endswith("preflight passed: 2 pass\n")


def test_an_unknown_item_exits_1_unless_unknown_is_allowed(
    items: list[object], config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items.append(item(3, "tuning", answering(Status.UNKNOWN, "no state database")))
    assert main(["preflight", "--config", str(config)]) == 1
    assert main(["preflight", "--config", str(config), "--allow", "unknown"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("preflight passed: 2 pass, 1 unknown (unknown allowed)\n")
    items.append(item(4, "acceptance", answering(Status.FAIL, "low", fix="specguard diagnose")))
    assert main(["preflight", "--config", str(config), "--allow", "unknown"]) == 1  # a failure still fails


def test_json_and_only(items: list[object], config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items.append(item(4, "acceptance", answering(Status.FAIL, "low", fix="specguard diagnose")))
    assert main(["preflight", "--config", str(config), "--json", "--only", "acceptance,baseline"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert [(i["key"], i["status"]) for i in found["items"]] == [("baseline", "pass"), ("acceptance", "fail")]
    assert found["passed"] is False and found["config"] == str(config)


def test_out_writes_the_markdown_record(items: list[object], config: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    record = tmp_path / "CHG-1234.md"
    assert main(["preflight", "--config", str(config), "--out", str(record)]) == 0
    text = record.read_text()
    assert text.startswith("# Preflight of speculative decoding on ")
    assert "| 2 | the compat item | **pass** |" in text and "- fits" in text
    assert f"specguard preflight: record written to {record}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--only", "baseline,nope"], "specguard preflight: --only 'baseline,nope': no item nope; items are baseline, compat, "),
        (["--only", ","], "specguard preflight: --only ',': no item (none given); items are "),
        (["--out", "/no/such/dir/record.md"], "specguard preflight: --out /no/such/dir/record.md: no such directory /no/such/dir"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_before_anything_runs(
    items: list[object], config: Path, args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    items[0] = item(1, "baseline", _never)
    assert main(["preflight", "--config", str(config), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(said) and len(captured.err.splitlines()) == 1


def test_a_bad_config_exits_2_with_its_file_line_and_field(
    items: list[object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "specguard.yaml"
    config.write_text("state_dir: state\npreflight:\n  min_acceptance: 1.5\n")
    assert main(["preflight", "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{config}:3: preflight.min_acceptance: ")


def test_allow_takes_only_unknown(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["preflight", "--config", str(config), "--allow", "fail"])
    assert exited.value.code == 2
    assert "argument --allow: invalid choice: 'fail'" in capsys.readouterr().err


async def _never(ctx: object) -> object:
    raise AssertionError("no item may run on bad input")
