"""The daemon's link to its fleet (the ``coordination:`` section): the store's client, the gate the
disrupting actions take their slots through, and the heartbeat that registers this host and keeps
the slots its actions should hold. Without the section: nothing, and a host acts alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from specguard.actions import Action
from specguard.coordination.config import CoordinationConfig
from specguard.coordination.gate import FleetGate
from specguard.coordination.opening import ClientMissing, open_coordinator
from specguard.coordination.status import shown_limit
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

log = logging.getLogger("specguard.fleet")


class DaemonFleet:
    def __init__(self, config: CoordinationConfig | None, store: Store) -> None:
        self.config = config
        self.store = store
        self.gate: FleetGate | None = None
        if config is not None:
            try:
                coordinator = open_coordinator(config)
            except (ClientMissing, ValueError) as exc:  # (the config check says so first)
                raise SystemExit(f"specguard: {exc}") from None
            self.gate = FleetGate(coordinator, config)
        self._heartbeat: asyncio.Task[None] | None = None

    def attach(self, actions: Mapping[str, Action]) -> None:
        """Hand the gate to the config's actions (at the start, and after each reload, which
        builds them anew): a restart or a fallback then takes its slot first."""
        if self.gate is None:
            return
        self.gate.keepers.clear()
        for name, action in actions.items():
            action.coordinate(self.gate, StoreMemory(self.store, name))

    def start(self) -> None:
        if self.gate is not None and self._heartbeat is None:
            log.info(
                "in the fleet of %s %s as %s: at most %s restarting at once%s",
                self.gate.config.store, self.gate.config.url, self.gate.host,
                shown_limit(self.gate.config.max_concurrent_restarts),
                "" if self.gate.config.max_in_fallback is None
                else f", {shown_limit(self.gate.config.max_in_fallback)} in fallback",
            )  # fmt: skip
            self._heartbeat = asyncio.get_running_loop().create_task(self.gate.heartbeat())

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self.gate is not None:
            await self.gate.coordinator.close()

    def status(self) -> dict[str, Any] | None:
        """The link as /api/status shows it (None: no coordination section)."""
        if self.gate is None:
            return None
        c = self.gate.config
        return {
            "store": c.store,
            "url": c.url,
            "host": self.gate.host,
            "max_concurrent_restarts": shown_limit(c.max_concurrent_restarts),
            "restarts_per_hour": c.restarts_per_hour,
            "max_in_fallback": None if c.max_in_fallback is None else shown_limit(c.max_in_fallback),
            "unreachable_since": self.gate.unavailable_since,
            "last_error": self.gate.last_error or None,
        }
