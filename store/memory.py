"""Each action's memory, kept in the store (``action_memory``), keyed by the action's name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specguard.store.database import Store


class StoreMemory:
    """An :class:`actions.base.ActionMemory` for one action."""

    def __init__(self, store: Store, action: str) -> None:
        self.store = store
        self.action = action

    async def read(self, key: str) -> Any:
        return await self.store.memory_read(self.action, key)

    async def update(
        self,
        key: str,
        change: Callable[[Any], Any],
        notes: Callable[[], Sequence[tuple[int, str]]] | None = None,
    ) -> Any:
        return await self.store.memory_update(self.action, key, change, notes)

    def of(self, action: str) -> StoreMemory:
        return StoreMemory(self.store, action)
