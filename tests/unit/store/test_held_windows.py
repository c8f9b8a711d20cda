"""A detector's warm-up windows in the store: packed bytes in ``series_state.held`` (schema 9), the
rest of its state as JSON; a database an older specguard wrote (the windows as base64 in the JSON,
no such column) is read as it is, upgraded when the daemon opens it, and written the new way."""

from __future__ import annotations

import base64
import contextlib
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

from specguard.engine.detector_state import DetectorState
from specguard.engine.warmup import Held
from specguard.store.commits import load_states_read_only
from specguard.store.connection import connect
from specguard.store.database import Store
from specguard.store.records import SeriesState, State
from specguard.store.schema import SCHEMA

KEY = '{"instance": "vllm-a:8000"}'


def warming(windows: int) -> DetectorState:
    state = DetectorState()
    for i in range(windows):
        state.warmup.add(80.0 + i % 3, 100.0, i > 0)
        state.held.add(1_800_000_000.0 + 5 * i, 80.0 + i % 3, 100.0)
    return state


def older_database(path: Path, state: DetectorState) -> None:
    """The database as specguard with schema 8 left it: no held column, the windows base64 in the JSON."""
    with contextlib.closing(connect(path)) as db:
        for statement in SCHEMA.replace(" detector TEXT, held BLOB,", " detector TEXT,").split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('schema_version', '8')")
        detector = state.to_json()
        detector["held"] = {
            "origin": state.held.origin,
            "packed": base64.b64encode(state.held.packed).decode(),
        }
        db.execute(
            "INSERT INTO series_state (rule, series, labels, state, consecutive, detector) VALUES (?,?,?,?,?,?)",
            ("collapse", KEY, json.dumps({"instance": "vllm-a:8000"}), "inactive", 0, json.dumps(detector)),
        )
        db.commit()


async def test_the_windows_go_to_their_own_column_and_come_back_as_they_were(tmp_path: Path) -> None:
    state = warming(720)
    store = Store(tmp_path / "specguard.db")
    await store.open()
    series = SeriesState(labels={"instance": "vllm-a:8000"}, state=State.INACTIVE, detector=state.to_json())
    await store.commit_evaluation("collapse", {KEY: series}, [])
    loaded = (await store.load_states())["collapse"][KEY]
    await store.close()
    assert loaded.detector == series.detector
    back = DetectorState.from_json(loaded.detector)
    assert back.held.windows == state.held.windows and back.warmup.windows == 720
    with contextlib.closing(sqlite3.connect(tmp_path / "specguard.db")) as db:
        text, packed = db.execute("SELECT detector, held FROM series_state").fetchone()
    assert len(packed) == 720 * 24 and json.loads(text)["held"] == {"origin": state.held.origin}


async def test_a_database_an_older_specguard_wrote_is_read_as_it_is_and_written_the_new_way(
    tmp_path: Path,
) -> None:
    path = tmp_path / "specguard.db"
    state = warming(30)
    older_database(path, state)
    # eval reads a running daemon's database read-only, upgraded or not
    read = load_states_read_only(path)["collapse"][KEY]
    assert Held.from_json(read.detector["held"] if read.detector else None).windows == state.held.windows
    store = Store(path)
    await store.open()  # the daemon's open upgrades it
    loaded = (await store.load_states())["collapse"][KEY]
    assert DetectorState.from_json(loaded.detector).held.windows == state.held.windows
    # the detector's next window writes its state as the engine keeps it
    stepped = replace(loaded, detector=DetectorState.from_json(loaded.detector).to_json())
    await store.commit_evaluation("collapse", {KEY: stepped}, [])
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        version = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        text, packed = db.execute("SELECT detector, held FROM series_state").fetchone()
    assert version == "9" and packed == state.held.packed and "packed" not in json.loads(text)["held"]
