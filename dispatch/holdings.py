"""What each action holds in the world (a fallback engaged, vLLM's k) and how much of its work is
failing, on the daemon's ``/metrics``: read from the store when the dispatcher starts serving,
again whenever an action's memory changes (whoever changed it), and for every action when the
actions are replaced (a reload)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from specguard.actions import Action
from specguard.actions.feature_flag import STATE_KEY as FLAG_KEY
from specguard.actions.feature_flag import FeatureFlagAction, record_of
from specguard.metrics.registry import DaemonMetrics
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

log = logging.getLogger("specguard.dispatcher")


def failing_count(action: Action, state: Mapping[str, Any], flag: Mapping[str, Any] | None) -> float:
    """How much of the action's work is failing: a feature flag's writes failed in a row (``flag``:
    its record), whatever the action's ``state`` says under ``failing`` (a notifier's notices
    failed for good; true counts 1)."""
    if isinstance(action, FeatureFlagAction) and flag is not None:
        return float(max(0, int(flag.get("failures") or 0)))
    value = state.get("failing")
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
        return float(value)
    return 0.0


class Holdings:
    def __init__(self, store: Store, metrics: DaemonMetrics, actions: Callable[[], Mapping[str, Action]]):
        self.store = store
        self.metrics = metrics
        self._actions = actions
        self._stale: set[str] = set()  # actions whose holding /metrics shows may be old
        self._due = asyncio.Event()

    def mark(self, names: Iterable[str]) -> None:
        """What ``names`` hold may have changed: shown again by ``serve``."""
        self._stale.update(names)
        self._due.set()

    async def show(self, names: Sequence[str] | None = None) -> None:
        """Show on /metrics what the actions ``names`` (default: all) hold now, from the store."""
        actions = self._actions()
        for name in list(actions) if names is None else names:
            action = actions.get(name)
            if action is None:
                self.metrics.show_holding(name, None)
                self.metrics.show_failing(name, None)
                continue
            memory = StoreMemory(self.store, name)
            try:
                holding = await action.holding(memory)
            except Exception as exc:  # the last value stays; the next change reads it again
                log.warning("action %s: cannot read what it holds: %s: %s", name, type(exc).__name__, exc)
                continue
            self.metrics.show_holding(name, holding)
            try:
                state = await action.state(memory)
                flag = (
                    record_of(await memory.read(FLAG_KEY)) if isinstance(action, FeatureFlagAction) else None
                )
            except Exception as exc:
                log.warning("action %s: cannot read its state: %s: %s", name, type(exc).__name__, exc)
                continue
            self.metrics.show_failing(name, failing_count(action, state, flag))

    async def serve(self) -> None:
        # The first pass shows every action (marked when they were given): what a previous process
        # left in the store, a flag engaged before a restart included.
        while True:
            await self._due.wait()
            self._due.clear()
            stale, self._stale = self._stale, set()
            await self.show(sorted(stale))
