"""``specguard backup FILE``: a consistent copy of the state database while the daemon runs.

SQLite's online backup copies the database page by page inside read transactions, so the copy is
one consistent moment even while the daemon writes (WAL mode), and it includes what the WAL holds
that is not yet checkpointed: copying the ``.db`` file alone could miss the last minutes or catch a
half-written page. The copy is checked (``PRAGMA integrity_check``) and renamed into place only when
whole: an interrupted backup leaves no file that looks like one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from specguard.cli.shared.options import add_config
from specguard.cli.shared.statedb import state_database
from specguard.store.connection import read_only

PAGES_PER_STEP = 1024  # the daemon's writes wait at most one step's copy (a few ms)


def add_parser(sub: Any) -> None:
    backup = sub.add_parser(
        "backup",
        help="copy the state database, consistently, while the daemon runs",
        description="Write a consistent copy of the state database (rule states, events, action "
        "runs, the Slack outbox, flag and ladder state, history) to FILE, with SQLite's online "
        "backup: the daemon may keep running. The copy is checked before it is put in place. "
        "Restore by stopping the daemon and putting the copy where the state database was "
        "(owned by the user the daemon runs as).",
    )
    add_config(backup)
    backup.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    backup.add_argument("file", type=Path, metavar="FILE", help="the copy to write (not overwritten)")


def backup(source: Path, target: Path) -> dict[str, int]:
    """Copy ``source`` to ``target`` (which must not exist). Raises ValueError with the reason."""
    if target.exists():
        raise ValueError(f"{target} exists: give a new file (a backup never overwrites one)")
    if not target.parent.is_dir():
        raise ValueError(f"{target.parent} is not a directory")
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        partial.touch(mode=0o600, exist_ok=False)  # the target's directory must take the copy
    except OSError as exc:
        raise ValueError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        # The daemon's database read-only: a backup must never be what changes it.
        with (
            contextlib.closing(read_only(source, timeout=30)) as db,
            contextlib.closing(sqlite3.connect(partial)) as copy,
        ):
            db.backup(copy, pages=PAGES_PER_STEP)
            check = copy.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                raise ValueError(f"the copy does not check out: {check}")
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            tables = {
                name: copy.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
                for (name,) in copy.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        os.replace(partial, target)
    except sqlite3.Error as exc:
        raise ValueError(f"cannot copy {source}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return tables


def cmd_backup(args: argparse.Namespace) -> int:
    source = state_database(args, "backup")
    if source is None:
        return 1
    target = Path.cwd() / args.file.expanduser()
    try:
        tables = backup(source, target)
    except ValueError as exc:
        print(f"specguard backup: {exc}", file=sys.stderr)
        return 1
    shown = ", ".join(
        f"{tables.get(table, 0):,} {what}"
        for table, what in (
            ("events", "events"),
            ("action_runs", "action runs"),
            ("history", "minutes of history"),
        )
    )
    print(f"backed up {source} to {target} ({target.stat().st_size:,} bytes; {shown})")
    return 0
