"""Plays a scenario's timeline (sim.scenario) on running engines, on the event loop's clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from specguard.sim.engine.engine import Engine
from specguard.sim.scenario import KvRamp, Scenario, TimelineEvent

log = logging.getLogger(__name__)


async def run_scenario(
    scenario: Scenario, engines: Sequence[Engine], die: Callable[[], Awaitable[None]]
) -> None:
    """Apply the timeline to ``engines`` on the event loop's clock; ``die`` ends the simulator."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for event in scenario.timeline:
        await asyncio.sleep(max(start + event.at - loop.time(), 0.0))
        if event.die:
            await die()
            return
        targets = list(engines) if event.engine is None else [engines[event.engine]]
        where = "" if event.engine is None else f" on engine {event.engine}"
        for engine in targets:
            _apply(event, engine)
        log.info("scenario at %gs%s: %s", event.at, where, _describe(event))


def _apply(event: TimelineEvent, engine: Engine) -> None:
    if event.acceptance is not None:
        engine.set_acceptance(event.acceptance)
    if event.acceptance_by_position is not None:
        engine.set_acceptance(event.acceptance_by_position)
    if isinstance(event.kv_usage, KvRamp):
        engine.ramp_kv_usage_floor(event.kv_usage.to, event.kv_usage.over)
    elif event.kv_usage is not None:
        engine.set_kv_usage_floor(event.kv_usage)


def _describe(event: TimelineEvent) -> str:
    parts = []
    if event.acceptance is not None:
        parts.append(f"acceptance {event.acceptance:g}")
    if event.acceptance_by_position is not None:
        parts.append(f"acceptance by position {event.acceptance_by_position}")
    if isinstance(event.kv_usage, KvRamp):
        parts.append(f"KV usage floor to {event.kv_usage.to:g} over {event.kv_usage.over:g}s")
    elif event.kv_usage is not None:
        parts.append(f"KV usage floor {event.kv_usage:g}")
    return ", ".join(parts)
