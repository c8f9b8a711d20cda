"""The eleven checklist items, in the playbook's order. Each module has ``NUMBER``, ``KEY``,
``TITLE`` and ``async def check(ctx: Context) -> Answer``."""

from __future__ import annotations

from types import ModuleType

from specguard.preflight.items import (
    acceptance,
    baseline,
    compat,
    drill,
    kv_cache,
    prometheus,
    report,
    routing,
    runbook,
    speedup,
    tuning,
)

ITEMS: tuple[ModuleType, ...] = (
    baseline,
    compat,
    tuning,
    acceptance,
    speedup,
    kv_cache,
    drill,
    routing,
    prometheus,
    report,
    runbook,
)
