"""`specguard backup FILE`: a consistent copy of the state database, taken while the daemon writes
to it, holding what the WAL has not yet checkpointed; bad targets refused with the reason."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.ports import free_port
from tests.processes import Daemon, specguard


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


async def test_a_backup_taken_while_the_daemon_writes_is_whole_and_restores(
    tmp_path: Path, vllm: str, daemons: list[Daemon]
) -> None:
    port = free_port()
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 500ms\n"
        f"sources: {{scrape: {{targets: [{vllm!r}]}}}}\nrules: [builtin:speculative]\n"
    )
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemons.append(daemon)
    daemon.start()
    await daemon.wait_for(lambda s: any(r["verdict"] == "ok" for r in s["rules"]), timeout=60)
    database = tmp_path / "state" / "specguard.db"
    # The daemon is writing: its latest commits are in the WAL, not yet in the .db file.
    assert (tmp_path / "state" / "specguard.db-wal").stat().st_size > 0

    copy = tmp_path / "backups" / "specguard-copy.db"
    copy.parent.mkdir()
    code, out, err = await specguard("backup", "--config", str(config), str(copy))
    assert code == 0, err
    assert out.startswith(f"backed up {database} to {copy} (")
    assert "minutes of history" in out

    with sqlite3.connect(copy) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file, no WAL beside
    assert not list(copy.parent.glob("*-wal")) and not list(copy.parent.glob(".*partial*"))
    assert _count(copy, "series_state") > 0  # the rules' states
    assert _count(copy, "history_last") == 1  # the scrape history compares with next
    status, _ = await daemon.get("/healthz")
    assert status == 200  # the daemon carried on while it was copied

    # Restore: stop, put the copy in place, start; the daemon resumes from it.
    assert daemon.stop() == 0
    for leftover in database.parent.glob("specguard.db*"):
        leftover.unlink()
    copy.rename(database)
    daemon.start()
    resumed = await daemon.wait_for(lambda s: any(r["verdict"] == "ok" for r in s["rules"]), timeout=60)
    assert resumed["store"]["error"] is None
    assert "state loaded from" in daemon.log.read_text()


async def test_a_backup_never_overwrites_and_says_why_it_cannot_write(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    with sqlite3.connect(state / "specguard.db") as conn:
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY)")
    existing = tmp_path / "kept.db"
    existing.write_text("an earlier backup")
    code, _, err = await specguard("backup", "--state-dir", str(state), str(existing))
    assert code == 1
    assert (
        err.strip() == f"specguard backup: {existing} exists: give a new file (a backup never overwrites one)"
    )
    assert existing.read_text() == "an earlier backup"

    code, _, err = await specguard(
        "backup", "--state-dir", str(state), str(tmp_path / "no" / "such" / "x.db")
    )
    assert code == 1 and "is not a directory" in err and "Traceback" not in err

    code, _, err = await specguard("backup", "--state-dir", str(tmp_path / "empty"), str(tmp_path / "x.db"))
    assert code == 1 and "no state database at" in err

    # A directory that takes no file, even for root.
    code, _, err = await specguard("backup", "--state-dir", str(state), "/proc/specguard-copy.db")
    assert code == 1
    assert err.startswith("specguard backup: cannot write /proc/specguard-copy.db: "), err
