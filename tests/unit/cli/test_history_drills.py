"""``specguard history --drills``: the drills the store recorded, newest first, with their evidence."""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from pathlib import Path

import pytest

from specguard.cli.entry import main
from specguard.store import drills
from specguard.store.database import opened


def config(tmp_path: Path) -> Path:
    path = tmp_path / "specguard.yaml"
    path.write_text("state_dir: state\n")
    return path


def write_one(
    started: float,
    finished: float | None,
    outcome: str,
    detail: str,
    evidence: list[str],
    db: sqlite3.Connection,
) -> None:
    drill = drills.start(db, "fallback", started)
    if finished is not None:
        drills.finish(db, drill, finished, outcome, detail, evidence)


def record(tmp_path: Path, *rows: tuple[float, float | None, str, str, list[str]]) -> None:
    async def write() -> None:
        async with opened(tmp_path / "state" / "specguard.db") as store:
            for row in rows:
                await store.call(functools.partial(write_one, *row))

    asyncio.run(write())


def test_drills_are_listed_newest_first_with_their_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    record(
        tmp_path,
        (
            1796484000.0,
            1796484012.5,
            "failed",
            "traffic did not move: ...",
            ["drill #1 of fallback (its nginx backend)"],
        ),
        (
            1796570400.0,
            1796570409.0,
            "passed",
            "engaged, traffic moved, restored through the canary",
            ["a", "b"],
        ),
        (1796570500.0, None, "", "", []),  # under way, or its process killed
    )
    assert main(["history", "--config", str(path), "--drills"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "STARTED (UTC)        DRILL  ACTION    OUTCOME  TOOK   DETAIL",
        "2026-12-06 15:21:40  #3     fallback  running  -      -",
        "2026-12-06 15:20:00  #2     fallback  passed   9.0s   engaged, traffic moved, restored through the canary",
        "                     a",
        "                     b",
        "2026-12-05 15:20:00  #1     fallback  failed   12.5s  traffic did not move: ...",
        "                     drill #1 of fallback (its nginx backend)",
    ]
    assert main(["history", "--config", str(path), "--drills", "--limit", "1", "--format", "json"]) == 0
    (latest,) = json.loads(capsys.readouterr().out)
    assert latest == {"id": 3, "started": 1796570500.0, "finished": None, "action": "fallback",
                      "outcome": "running", "detail": "", "evidence": []}  # fmt: skip


def test_no_drill_on_record_says_how_to_run_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path)
    record(tmp_path)
    assert main(["history", "--config", str(path), "--drills"]) == 0
    assert capsys.readouterr().out == "no drill on record: run specguard preflight --drill\n"


def test_drills_are_no_rules_so_rule_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path)
    assert main(["history", "--config", str(path), "--drills", "--rule", "acceptance_low"]) == 2
    assert capsys.readouterr().err == (
        "specguard history: --rule and --drills do not go together (a drill is no rule's)\n"
    )
