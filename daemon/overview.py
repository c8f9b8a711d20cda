"""The daemon's whole state as one document: what ``/api/status`` returns, ``specguard status``
prints and the page at ``/`` shows.

The daemon's own view (``self_status.status``: rules, targets, the flags' plans and trouble, the
runs that wait) is in memory; what lives in the store is read here: the silences in force or to
come, what each feature flag was last confirmed to be, each ladder's k, and what every action says
of itself (``Action.state``: a notifier's backlog and last error). A store that cannot be read
leaves those parts out, with the reason, and the rest is still shown.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from specguard.actions import Action
from specguard.actions.feature_flag import FeatureFlagAction, record_of
from specguard.actions.vllm_restart import VllmRestartAction
from specguard.dispatch import silences
from specguard.store.database import Store, StoreError
from specguard.store.memory import StoreMemory

# Changes of a ladder shown with it (``specguard ladder show`` lists more).
LADDER_LOG = 3
# How long the store's part may take: a store that stalls (a disk that hangs) must not hold the
# status, which health checks and on-call read when things go wrong.
STORE_WAIT = 2.0


async def gather(
    status: Mapping[str, Any],
    health: tuple[bool, Mapping[str, Any]],
    store: Store,
    actions: Mapping[str, Action],
    now: float,
    started_at: float,
) -> dict[str, Any]:
    """``status`` (``self_status.status``) with the daemon's health, its clock, the silences,
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
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STORE_WAIT  # for the whole of the store's part
    try:
        async with asyncio.timeout_at(deadline):
            found = await store.call(partial(silences.listed, now=now))
        out["silences"] = [
            {**asdict(item), "state": "active" if item.active(now) else "pending"} for item in found
        ]
    except (StoreError, TimeoutError) as exc:
        out["silences"] = None
        problems.append(f"silences: {_why(exc)}")
    fallbacks = {name: dict(shown) for name, shown in status.get("fallbacks", {}).items()}
    ladders: list[dict[str, Any]] = []
    shown: dict[str, Any] = {}
    for name, action in sorted(actions.items()):
        shown[name] = {"type": action.type, "state": None}
        try:  # an action that says what it knows without asking the store answers even past the deadline
            async with asyncio.timeout_at(deadline):
                shown[name]["state"] = await _state(name, action, store)
        except (StoreError, TimeoutError) as exc:
            problems.append(f"{name}: {_why(exc)}")
            continue
        if not isinstance(action, FeatureFlagAction | VllmRestartAction):
            continue
        if loop.time() >= deadline:  # the store has had its time: not asked again
            problems.append(f"{name}: {_why(TimeoutError())}")
            continue
        try:
            async with asyncio.timeout_at(deadline):
                await _action_part(name, action, store, fallbacks, ladders)
        except (StoreError, TimeoutError) as exc:
            problems.append(f"{name}: {_why(exc)}")
    out["fallbacks"] = fallbacks
    out["ladders"] = ladders
    out["actions"] = shown  # each action's type and what it says of itself (Action.state)
    if problems:
        out["store"]["read_error"] = "; ".join(problems)
    return out


async def _action_part(
    name: str, action: Action, store: Store, fallbacks: dict[str, Any], ladders: list[dict[str, Any]]
) -> None:
    """What a feature flag was last confirmed to be (beside its plan); a ladder's k and changes."""
    if isinstance(action, FeatureFlagAction):
        record = record_of(await store.memory_read(name, "flag"))
        plan = fallbacks.setdefault(
            name, {"should_be": None, "why": "not looked at yet", "holders": [], "restore_at": None}
        )
        plan["is"], plan["is_since"] = record["state"], record.get("since")
        # writes failed in a row (reset once one is confirmed); canary probes that kept it engaged
        plan["failures"], plan["canary_failures"] = record["failures"], record["canary_failures"]
        if plan.get("next_try") is None and record.get("next_try") is not None:
            plan["next_try"] = record["next_try"]  # a change recorded on no event (a drain's)
    elif isinstance(action, VllmRestartAction):
        shown = await action.show(StoreMemory(store, name))
        ladders.append({**shown, "log": shown["log"][-LADDER_LOG:]})


async def _state(name: str, action: Action, store: Store) -> dict[str, Any] | str:
    """What the action says of itself, as JSON values; or why it could not say (its own error,
    shown as text; the store's goes on to the caller)."""
    try:
        state = await action.state(StoreMemory(store, name))
    except (StoreError, TimeoutError):
        raise
    except Exception as exc:  # an action's bug must not take the status down
        return f"cannot be read: {type(exc).__name__}: {exc}"
    return dict(state)


def _why(exc: Exception) -> str:
    return f"the store did not answer within {STORE_WAIT:g}s" if isinstance(exc, TimeoutError) else str(exc)


def _size(path: Path) -> int | None:
    """The database's bytes on disk, its write-ahead log included."""
    total = None
    for each in (path, path.with_name(path.name + "-wal")):
        try:
            total = (total or 0) + os.stat(each).st_size
        except OSError:
            continue
    return total
