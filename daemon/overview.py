"""The daemon's whole state as one document: what ``/api/status`` returns, ``specguard status``
prints and the page at ``/`` shows.

The runtime's own view (rules, targets, the flags' plans, the runs that wait) is in memory; what
lives in the store is read here: the silences in force or to come, what each feature flag was
last confirmed to be, each ladder's k. A store that cannot be read leaves those parts out, with
the reason, and the rest is still shown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from actions import Action
from actions.feature_flag import FeatureFlagAction, record_of
from actions.vllm_restart import VllmRestartAction
from daemon.dispatch import silences
from daemon.dispatch.memory import StoreMemory
from daemon.store import Store, StoreError

# Changes of a ladder shown with it (``specguard ladder show`` lists more).
LADDER_LOG = 3


async def gather(
    status: Mapping[str, Any],
    health: tuple[bool, Mapping[str, Any]],
    store: Store,
    actions: Mapping[str, Action],
    now: float,
    started_at: float,
) -> dict[str, Any]:
    """``status`` (the runtime's ``status()``) with the daemon's health, its clock, the silences,
    the flags' confirmed states and the ladders."""
    healthy, body = health
    out: dict[str, Any] = {
        **status,
        "now": now,
        "started_at": started_at,
        "health": {"healthy": healthy, "status": body.get("status"), "reason": body.get("reason")},
    }
    out["store"] = {**status.get("store", {}), "bytes": _size(store.path)}
    problems: list[str] = []
    try:
        found = await store.call(partial(silences.listed, now=now))
        out["silences"] = [
            {**asdict(item), "state": "active" if item.active(now) else "pending"} for item in found
        ]
    except StoreError as exc:
        out["silences"] = None
        problems.append(f"silences: {exc}")
    fallbacks = {name: dict(shown) for name, shown in status.get("fallbacks", {}).items()}
    ladders = []
    for name, action in sorted(actions.items()):
        try:
            if isinstance(action, FeatureFlagAction):
                record = record_of(await store.memory_read(name, "flag"))
                plan = fallbacks.setdefault(
                    name, {"should_be": None, "why": "not looked at yet", "holders": [], "restore_at": None}
                )
                plan["is"], plan["is_since"] = record["state"], record.get("since")
            elif isinstance(action, VllmRestartAction):
                shown = await action.show(StoreMemory(store, name))
                ladders.append({**shown, "log": shown["log"][-LADDER_LOG:]})
        except StoreError as exc:
            problems.append(f"{name}: {exc}")
    out["fallbacks"] = fallbacks
    out["ladders"] = ladders
    if problems:
        out["store"]["read_error"] = "; ".join(problems)
    return out


def _size(path: Path) -> int | None:
    """The database's bytes on disk, its write-ahead log included."""
    total = None
    for each in (path, path.with_name(path.name + "-wal")):
        try:
            total = (total or 0) + os.stat(each).st_size
        except OSError:
            continue
    return total
