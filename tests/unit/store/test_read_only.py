"""store.connection.read_only: a command's way into the daemon's database, never writing to it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from specguard.store.connection import connect, read_only


@pytest.mark.parametrize("name", ["plain", "what?mode=rw", "a#b", "100%25"])
def test_it_opens_the_file_named_whatever_its_name_and_refuses_writes(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "specguard.db"
    with contextlib.closing(connect(path)) as db:
        db.execute("CREATE TABLE t (v TEXT)")
        db.execute("INSERT INTO t VALUES ('kept')")
    with contextlib.closing(read_only(path)) as db:
        assert [row["v"] for row in db.execute("SELECT v FROM t")] == ["kept"]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.execute("INSERT INTO t VALUES ('written')")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("specguard.db-")) == [
        "specguard.db"
    ]


def test_a_missing_database_is_an_error_not_a_new_file(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError):
        read_only(tmp_path / "absent.db")
    assert not (tmp_path / "absent.db").exists()
