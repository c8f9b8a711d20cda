"""One checklist item's answer, and what every item is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from specguard.config.loading import Loaded


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"  # could not be checked on this host (said why in the evidence)


@dataclass(frozen=True)
class Answer:
    """What an item's check returns."""

    status: Status
    evidence: tuple[str, ...]  # what was read and found, one fact per line
    fix: str | None = None  # the command (or change) that makes it pass; None when it passes


@dataclass(frozen=True)
class ItemResult:
    number: int  # 1..11, the checklist's order
    key: str  # "baseline", "compat", ...: for --json and --allow
    title: str
    answer: Answer


@dataclass
class Context:
    """What every item reads: the loaded config (rules, actions, baseline), the state database, the
    time, and the command's options."""

    loaded: Loaded
    config_file: Path | None
    store_file: Path | None  # None: no state database (the daemon has not run)
    now: float
    drill: bool = False  # item 7: run the drill (engage, see traffic move, restore, record)
    notify_test: bool = False  # item 11: post a test message to Slack and delete it
    cache: dict[str, object] = field(default_factory=dict)  # facts items share (the servers' /version)
