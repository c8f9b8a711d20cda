"""One series' detector as the store keeps it (``DetectorState``), and the settings its warm-up
measured under (``calibration_of``).

A calibration holds only for the windows it was measured on: φ is the dispersion of windows of
the rule's interval (a window twice as long holds about twice the tokens of each request, and φ
grows with them), counted when they had ``min_trials``, over ``warmup``. The state keeps those
settings, and when the rule's differ (a reloaded or restarted daemon with another config) the
series warms up again, said once with the reason, rather than judging with a φ of other windows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specguard.common.sequential import Dispersion
from specguard.engine.warmup import Held, Unsettled
from specguard.rules.durations import format_duration
from specguard.rules.schema import Detect


@dataclass
class DetectorState:
    """One series' detector, as the store keeps it (``to_json``)."""

    g: float = 0.0  # the largest of gs: what the engine compares with h
    gs: list[float] = field(default_factory=list)  # one statistic per level to detect
    alpha0: float | None = None  # learned at the end of the warm-up (in_control: learn)
    phi: float | None = None  # estimated at the end of the warm-up
    warmup: Dispersion = field(default_factory=Dispersion)
    alpha: float | None = None  # the last window's α̂
    trials: float | None = None  # the last window's S + F
    evidence: float | None = None  # the last window's own evidence of a fall (the window test)
    windows: int = 0  # windows judged since the warm-up
    seen: float | None = None  # when the last window with data came (warm-up neighbours)
    # The settings the warm-up measured under (``calibration_of``); None in a state stored before
    # they were kept.
    calibration: dict[str, Any] | None = None
    held: Held = field(default_factory=Held)  # the warm-up's windows, until it calibrates
    # The last homogeneity check: passed (True), found a shift (False), none yet (None).
    homogeneous: bool | None = None
    unsettled: Unsettled | None = None  # the checks that found a shift, while they do
    in_control: float | None = None  # the α0 judged by: the rule's, the baseline's or alpha0
    in_control_from: str | None = None  # where it comes from: "rule", "baseline" or "warm-up"

    def to_json(self) -> dict[str, Any]:
        return {
            "calibration": self.calibration,
            "held": self.held.to_json(),
            "homogeneous": self.homogeneous,
            "unsettled": self.unsettled.to_json() if self.unsettled is not None else None,
            "in_control": self.in_control,
            "in_control_from": self.in_control_from,
            "g": self.g,
            "gs": list(self.gs),
            "alpha0": self.alpha0,
            "phi": self.phi,
            "warmup": self.warmup.to_json(),
            "alpha": self.alpha,
            "trials": self.trials,
            "evidence": self.evidence,
            "windows": self.windows,
            "seen": self.seen,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> DetectorState:
        if not raw:
            return cls()

        def number(key: str) -> float | None:
            value = raw.get(key)
            return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

        gs = raw.get("gs")
        calibration = raw.get("calibration")
        homogeneous = raw.get("homogeneous")
        source = raw.get("in_control_from")
        return cls(
            calibration=dict(calibration) if isinstance(calibration, dict) else None,
            held=Held.from_json(raw.get("held")),
            homogeneous=homogeneous if isinstance(homogeneous, bool) else None,
            unsettled=Unsettled.from_json(raw.get("unsettled")),
            in_control=number("in_control"),
            in_control_from=source if isinstance(source, str) else None,
            g=number("g") or 0.0,
            gs=[float(v) for v in gs if isinstance(v, int | float)] if isinstance(gs, list) else [],
            alpha0=number("alpha0"),
            phi=number("phi"),
            warmup=Dispersion.from_json(raw.get("warmup")),
            alpha=number("alpha"),
            trials=number("trials"),
            evidence=number("evidence"),
            windows=int(number("windows") or 0),
            seen=number("seen"),
        )


def calibration_of(detect: Detect, interval: float) -> dict[str, Any]:
    """What a warm-up's φ and α0 depend on: the windows (their length, the trials that make one
    count, how many) and which of φ and α0 it learns."""
    return {
        "interval": interval,
        "min_trials": detect.min_trials,
        "warmup": detect.warmup,
        "learns_phi": detect.phi is None,
        "learns_alpha0": detect.in_control == "learn",
    }


_MEASURED = (("interval", "the interval"), ("min_trials", "min_trials"), ("warmup", "the warm-up"))


def recalibration(detect: Detect, interval: float, stored: Mapping[str, Any] | None) -> str | None:
    """Why a state calibrated under ``stored`` cannot judge for this rule (None: it can)."""
    now = calibration_of(detect, interval)
    if stored is None or not (now["learns_phi"] or now["learns_alpha0"]):
        # Nothing learned, nothing stale. A state kept before its calibration was (None) is taken
        # as the rule's: it cannot be told, and an hour without detection is a worse default.
        return None
    reasons = []
    for key, name in _MEASURED:
        before, after = stored.get(key), now[key]
        if before != after:
            if key == "min_trials":
                reasons.append(f"{name} changed from {before} to {after}")
            else:
                shown = format_duration(before) if isinstance(before, int | float) else "unknown"
                reasons.append(f"{name} changed from {shown} to {format_duration(after)}")
    if now["learns_phi"] and not stored.get("learns_phi"):
        reasons.append("phi is now estimated, not given")
    if now["learns_alpha0"] and not stored.get("learns_alpha0"):
        reasons.append("in_control is now learned, not given")
    return "; ".join(reasons) or None
