"""The collapse detector's states as a daemon holds them near the end of its warm-up, for the fleet
benchmark's second phase: a daemon started about an hour ago.

A ``detect:`` rule with ``in_control: learn`` keeps every window of its warm-up (``warmup: 1h`` of
5 s windows: 720) in each series' state until the warm-up is checked for one level, and reads,
writes and stores that state at every window. Measuring that without an hour's wait: each series'
state gets, before the windows its rounds already held, as many earlier windows as make it
``short`` windows from the end of its warm-up, added the way the warm-up adds its own
(``Dispersion.add`` and ``Held.add``), each drawn at the level and the trials of the series' own
windows so far (binomial, in its normal approximation: numpy, which the daemon does not load, would
add its own memory to the daemon's), so that a healthy series' warm-up holds one level when it is
checked.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import replace

from specguard.common.sequential import Dispersion
from specguard.engine.detection import warmup_windows
from specguard.engine.detector_state import DetectorState
from specguard.engine.warmup import Held
from specguard.rules.schema import Detect
from specguard.store.records import SeriesState


def near_the_end(
    states: Mapping[str, SeriesState], detect: Detect, interval: float, short: int
) -> tuple[dict[str, SeriesState], int]:
    """``states`` with every warming detector ``short`` windows from the end of its warm-up, and
    how many series were so filled."""
    needed = warmup_windows(detect, interval)
    out = dict(states)
    filled = 0
    for index, (key, old) in enumerate(sorted(states.items())):
        state = DetectorState.from_json(old.detector)
        held = state.held.windows
        if not held or state.held.origin is None or len(held) >= needed - short:
            continue
        successes, trials = sum(w[1] for w in held), sum(w[2] for w in held)
        alpha, per_window = successes / trials, trials / len(held)
        rng = random.Random(2026 * 100_000 + index)
        first = state.held.origin
        earlier = needed - short - len(held)
        warmup, kept = Dispersion(), Held()
        for i in range(earlier):
            n = round(per_window)
            s = float(min(n, max(0, round(rng.gauss(n * alpha, math.sqrt(n * alpha * (1 - alpha)))))))
            warmup.add(s, float(n), i > 0)
            kept.add(first - (earlier - i) * interval, s, float(n))
        for offset, accepted, tried in held:
            warmup.add(accepted, tried, True)
            kept.add(first + offset, accepted, tried)
        state.warmup, state.held = warmup, kept
        out[key] = replace(old, detector=state.to_json())
        filled += 1
    return out, filled
