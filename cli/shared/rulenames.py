"""Rule names given on the command line (``eval --rule``, ``history --rule``, ``silence add
--rule``), checked against the config and the state database: a name no rule has is a mistake, said
with the close names, never an empty answer or a silence that matches nothing."""

from __future__ import annotations

import fnmatch
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from specguard.common.names import did_you_mean

# The exit code of a command-line mistake (as argparse's own): nothing was read or written.
USAGE = 2


def _where(loaded: Any) -> str:
    if loaded.config_file in (None, "<defaults>"):
        return "the default rules (no --config, no $SPECGUARD_CONFIG)"
    return str(loaded.config_file)


def _hint(name: str, known: Iterable[str]) -> str:
    names = sorted(set(known))
    hint = did_you_mean(name, names)
    if hint or not names:
        return hint
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f"; known rules: {shown}"


def eval_mistake(loaded: Any, names: Sequence[str]) -> str | None:
    """Why ``eval --rule NAME`` cannot evaluate these rules (no such rule, or a disabled one), or
    None when every one is an enabled rule of the config."""
    rules = {item.name: item for item in loaded.rules}
    for name in names:
        item = rules.get(name)
        if item is None:
            return f"--rule {name}: no such rule in {_where(loaded)}{_hint(name, rules)}"
        if not item.rule.enabled:
            where = f"{item.file}:{item.line}" if item.line else item.file
            return (
                f"--rule {name}: the rule is disabled (enabled: false, {where}): eval evaluates enabled rules"
            )
    return None


def recorded_rules(db: sqlite3.Connection) -> set[str]:
    """The rules the state database holds states or changes of (for ``Store.call``)."""
    rows = db.execute("SELECT rule FROM series_state UNION SELECT DISTINCT rule FROM events")
    return {row[0] for row in rows}


def history_mistake(loaded: Any, name: str, recorded: Iterable[str]) -> str | None:
    """Why ``history --rule NAME`` names no rule: neither the config nor the state database has it.
    A rule the database recorded but the config no longer has is fine: its history is shown."""
    configured = {item.name for item in loaded.rules}
    recorded = set(recorded)
    if name in configured or name in recorded:
        return None
    return (
        f"--rule {name}: no such rule in {_where(loaded)}, and the state database has recorded "
        f"none by that name{_hint(name, configured | recorded)}"
    )


def silence_mistake(loaded: Any, pattern: str, recorded: Iterable[str], hint: bool = True) -> str | None:
    """Why a silence for ``pattern`` (a name or a glob) would hold nothing back: no rule of the
    config, nor one recorded in the state database, matches it. None when one does."""
    known = {item.name for item in loaded.rules} | set(recorded)
    if any(fnmatch.fnmatchcase(name, pattern) for name in known):
        return None
    message = f"no rule in {_where(loaded)}, nor recorded in the state database, matches {pattern!r}"
    return message + (_hint(pattern, known) if hint else "")
