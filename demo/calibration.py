"""The demo's collapse detector before the drop. The drop waits until the detector has calibrated
on the healthy traffic (its warm-up must hold one level of acceptance), so that it has a level to
fall from. On a loaded machine the warm-up's windows come later than the timeline planned; landing
inside the warm-up, the drop would be taken for a shift and the detector would slide on instead of
calibrating, and never fire. So the drop waits for the calibration, up to a bound, and says so."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from specguard.daemon.runtime import Daemon
from specguard.engine.detection import shown

POLL = 0.25


@dataclass(frozen=True)
class Calibration:
    calibrated: bool
    waited: float  # seconds the drop waited for it
    text: str  # ``calibrated on the healthy traffic: in_control 0.741 (warm-up), phi 1.32``


def _now(daemon: Daemon, rule: str, instance: str) -> dict[str, Any] | None:
    """What the detector shows of the series of ``instance`` (None: no state for it yet)."""
    item = next((i for i in daemon.loaded.enabled_rules() if i.name == rule), None)
    if item is None or item.rule.detect is None:
        return None
    interval = item.every(daemon.loaded.config.interval)
    for state in daemon.states.get(rule, {}).values():
        if state.labels.get("instance") == instance:
            return shown(state, item.rule.detect, interval)
    return None


def _describe(d: dict[str, Any] | None) -> str:
    if d is None:
        return "no window with enough draft tokens yet"
    if d["warming_up"]:
        text = f"warming up, {d['warmup']}"
        return text + (f"; not homogeneous {d['not_homogeneous']}" if d.get("not_homogeneous") else "")
    level = "-" if d["in_control"] is None else f"{d['in_control']:.3f}"
    source = f" ({d['in_control_from']})" if d.get("in_control_from") else ""
    phi = "-" if d["phi"] is None else f"{d['phi']:.3g}"
    return f"calibrated on the healthy traffic: in_control {level}{source}, phi {phi}"


async def wait_calibrated(
    daemon: Daemon, rule: str, instance: str, bound: float, stop: asyncio.Event
) -> Calibration:
    """Once the detector of ``instance`` has calibrated, or after ``bound`` seconds (or a stop)
    with where it stands then."""
    started = time.monotonic()
    while True:
        d = _now(daemon, rule, instance)
        done = d is not None and not d["warming_up"]
        waited = time.monotonic() - started
        if done or waited >= bound or stop.is_set():
            return Calibration(done, waited, _describe(d))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=min(POLL, bound - waited))
