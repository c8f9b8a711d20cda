"""`specguard report` as an operator runs it, in its own process: the files it writes, and a clear
message (never a traceback) for each bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from specguard.store import history
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from tests.processes import specguard

DAY = 86400.0
START = 1_796_000_000.0 - 1_796_000_000.0 % DAY  # a UTC midnight


def seed(state: Path) -> None:
    async def write() -> None:
        store = Store(state / "specguard.db")
        await store.open()
        text = (
            'vllm:spec_decode_num_drafts_total{{model_name="m"}} {d}\n'
            'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {t}\n'
            'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {a}\n'
        )
        scrapes = [
            ("vllm:8000", START + 60 * i + 30, parse_exposition(text.format(d=10 * i, t=30 * i, a=12 * i)))
            for i in range(120)
        ]
        await store.call(lambda db: history.record(db, scrapes))
        await store.close()

    asyncio.run(write())


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "state").mkdir()
    seed(tmp_path / "state")
    path = tmp_path / "specguard.yaml"
    path.write_text("state_dir: state\n")
    return path


async def test_a_period_by_dates_is_written_in_each_format_asked(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, err = await specguard(
        "report", "--config", str(config), "--from", "2026-11-30", "--to", "2026-12-01",
        "--format", "json", "--format", "md", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    printed = [Path(line) for line in stdout.split()]
    assert printed[0] == out / "report-2026-11-30-2026-12-01.json"
    assert all(p.is_file() for p in printed)
    assert any(p.suffix == ".md" for p in printed) and any(p.suffix == ".png" for p in printed)
    report = json.loads(printed[0].read_text())
    (series,) = report["series"]
    assert series["headline"]["drafts"]["value"] == 1190  # 119 increases of 10
    assert series["headline"]["acceptance_rate"]["value"] == pytest.approx(12 / 30)
    assert report["period"] == {"from": "2026-11-30T00:00:00Z", "to": "2026-12-01T00:00:00Z", "seconds": DAY}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--from", "2026-13-01", "--to", "2026-12-02"], "--from: '2026-13-01' is not a date"),
        (["--to", "2026-12-02"], "--to needs --from"),
        (["--from", "2026-12-02", "--to", "2026-12-01"], "the period is empty"),
        (["--since", "a week"], "--since:"),
    ],
)
async def test_bad_periods_are_refused_with_the_option_named(
    config: Path, args: list[str], says: str
) -> None:
    code, _, err = await specguard("report", "--config", str(config), *args)
    assert code == 2
    assert says in err and "Traceback" not in err


async def test_no_state_database_says_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "specguard.yaml").write_text("state_dir: nowhere\n")
    code, _, err = await specguard("report", "--config", str(tmp_path / "specguard.yaml"))
    assert code == 1
    assert "no state database at" in err and "nowhere" in err


async def test_an_unwritable_output_directory_is_a_message(config: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    code, _, err = await specguard("report", "--config", str(config), "--out", str(tmp_path / "file" / "x"))
    assert code == 1
    assert "cannot write into" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("report", "says"),
    [
        ("schedule: '0 8 * *'", "report.schedule: '0 8 * *' is not a crontab schedule"),
        ("{schedule: '0 8 * * mon', timezone: Mars/Olympus}", "unknown time zone 'Mars/Olympus'"),
        ("{slack: log}", "report.slack: 'log' is not a slack action"),
        ("{slack: oncall}", "report.slack: no action named 'oncall'"),
        ("{formats: [pdf]}", "report.formats[0]: Input should be"),
        ("{formats: []}", "report.formats: give at least one of html, md, json"),
    ],
)
async def test_a_bad_report_config_names_the_file_line_and_field(
    tmp_path: Path, report: str, says: str
) -> None:
    path = tmp_path / "specguard.yaml"
    path.write_text(
        f"state_dir: state\nreport: {report}\n" if report.startswith("{") else f"report:\n  {report}\n"
    )
    code, out, err = await specguard("check", "--config", str(path))
    assert code == 1
    text = out + err
    assert f"{path}:2" in text or f"{path}:3" in text, text
    assert says in text, text
