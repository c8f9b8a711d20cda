"""``specguard check``'s word on the rules with ``detect:``: where each takes its in-control
acceptance from (the rule's number, the baseline file's token_acceptance, or the warm-up), and,
from the state database when there is one (read, never written), where each series' calibration
stands: warming up, calibrated, or held back by a warm-up that is not homogeneous.

Nothing is printed for a detector with nothing to say (no baseline, no state yet).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Mapping
from typing import Any

from specguard.rules.schema import DETECT_SIGNAL, Detect


def print_detectors(loaded: Any) -> None:
    from specguard.engine.detection import shown

    items = [item for item in loaded.enabled_rules() if item.rule.detect is not None]
    if not items:
        return
    states = stored_states(loaded)
    lines: list[str] = []
    for item in items:
        detect: Detect = item.rule.detect
        source = _in_control_source(detect, loaded.baseline)
        if source is not None:
            lines.append(f"{item.name}: in_control {source}")
        interval = item.every(loaded.config.interval)
        for series in sorted(states.get(item.name, {}).values(), key=lambda s: sorted(s.labels.items())):
            d = shown(series, detect, interval)
            if d is not None:
                lines.append(f"{item.name} {_labels(series.labels)}: {_calibration(d)}")
    if lines:
        print("detectors:")
        for line in lines:
            print(f"  {line}")


def _in_control_source(detect: Detect, baseline: Any) -> str | None:
    """Where ``learn`` and ``baseline`` take α0 from, per baseline entry (None: a number, or
    ``learn`` without a baseline file, which learns it and needs no word)."""
    if isinstance(detect.in_control, float | int) or (detect.in_control == "learn" and baseline is None):
        return None
    if baseline is None:  # in_control: baseline
        return "from the baseline file, and none is configured: its series report an error"
    otherwise = "learned over the warm-up" if detect.in_control == "learn" else "an error for its series"
    uses = []
    for entry in baseline.entries:
        who = entry.describe().removeprefix("the baseline entry for ").removeprefix("the ")
        value = entry.signals.get(DETECT_SIGNAL)
        uses.append(f"{who}: {value:.4g}" if value is not None else f"{who}: none, {otherwise}")
    return f"from the baseline's {DETECT_SIGNAL} ({'; '.join(uses)})"


def _calibration(d: Mapping[str, Any]) -> str:
    """``warming up, 360/720 windows``, ``calibrated: in_control 0.78 (baseline), phi 61``, or
    ``warming up, 719/720 windows; not homogeneous since ...``."""
    if d["warming_up"]:
        text = f"warming up, {d['warmup']}"
        if d.get("not_homogeneous"):
            text += f"; not homogeneous {d['not_homogeneous']}"
        return text
    level = "-" if d["in_control"] is None else f"{d['in_control']:.3f}"
    source = f" ({d['in_control_from']})" if d.get("in_control_from") else ""
    phi = "-" if d["phi"] is None else f"{d['phi']:.3g}"
    return f"calibrated: in_control {level}{source}, phi {phi}"


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def stored_states(loaded: Any) -> dict[str, Any]:
    """The rule states of the config's state database, read-only (as `eval` and `check` read
    them); none when there is none."""
    from specguard.store.commits import load_states_read_only

    path = loaded.config.store_file()
    if not path.is_file():
        return {}
    with contextlib.suppress(sqlite3.Error):
        return load_states_read_only(path)
    return {}
