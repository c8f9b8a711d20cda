"""The state database a command reads: the one of the config's state_dir, or of --state-dir."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specguard.cli.shared.printing import print_problems


def state_database(
    args: argparse.Namespace, command: str, loaded_out: list[Any] | None = None
) -> Path | None:
    """The state database of the config's state_dir (or --state-dir); None, said, when there is
    none or the config is wrong. The loaded config goes to ``loaded_out``."""
    from specguard.config.loading import load

    overrides = {"state_dir": str(Path.cwd() / args.state_dir.expanduser())} if args.state_dir else {}
    loaded = load(args.config, (), overrides)
    if not loaded.ok:
        print_problems(loaded)
        return None
    if loaded_out is not None:
        loaded_out.append(loaded)
    path = loaded.config.store_file()
    if not path.is_file():
        print(
            f"specguard {command}: no state database at {path}: the daemon has not run with this "
            "state_dir (give --config or --state-dir)",
            file=sys.stderr,
        )
        return None
    return path
