"""Rules with ``detect:``: the CUSUM of ``common.sequential`` turned into what the engine judges.

Each evaluation takes one window, the rule's interval, of ``token_acceptance`` per series: its α̂
and its trials N = S + F. Per series:

- a window with fewer than ``min_trials`` trials is *no data*: G neither grows nor resets;
- during the warm-up (``warmup`` of windows with data) the windows estimate φ (Pearson's χ²/df)
  and, with ``in_control: learn``, α0; the series is *warming up*. They are taken as in control
  only once they pass a homogeneity check (``engine.warmup``): a warm-up that holds a shift slides
  on instead of calibrating. With ``in_control: learn``, a baseline file's ``token_acceptance`` for
  the series is preferred to the learned α0;
- after it, Z = [S ln(α1/α0) + F ln((1−α1)/(1−α0))] / φ and G = max(0, G + Z), held at 2h; with
  several levels α1, one G each, and the rule's value is the largest;
- and each window alone (``single_window``): when its α̂ is at or below the mildest level and
  its own evidence, (N / φ_w) KL(α̂ || α0) with φ_w the windows' dispersion without their
  correlation, reaches h, every G is set to 2h, as if the CUSUM had alarmed. A sudden collapse on
  a busy server shows in one window, where the CUSUM, dividing by the long-run φ (tens of times
  φ_w), needs several; an in-control window crosses it at most once in T on average (Chernoff's
  bound), so it is one more test under the union bound below.

The engine then sees the value G against the threshold h = ln(false_alarm_every / interval) with
the condition ``G >= h`` (h + ln(n) with n tests, the levels and the window test: a union bound
keeps the false-alarm target for all of them together): pending, firing, ``for`` and the no-data
policy work as for any rule. When the series resolves, G starts again from 0. Everything lives
in the series' ``detector`` state, which the store keeps: a restart neither forgets the
calibration nor the evidence so far.

A calibration holds only for the windows it was measured on: φ is the dispersion of windows of
the rule's interval (a window twice as long holds about twice the tokens of each request, and φ
grows with them), counted when they had ``min_trials``, over ``warmup``. The state keeps those
settings, and when the rule's differ (a reloaded or restarted daemon with another config) the
series warms up again, said once with the reason, rather than judging with a φ of other windows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from specguard.common.sequential import EDGE, Dispersion, cusum_step, llr, threshold, window_evidence
from specguard.engine.states import Outcome, series_key
from specguard.engine.warmup import Held, Unsettled, clock, examine, shift_reason, slide_past
from specguard.rules.conditions import Condition
from specguard.rules.durations import format_duration
from specguard.rules.schema import DETECT_SIGNAL, Detect
from specguard.sources.base import Invalid, Series, SourceResult
from specguard.store.baseline import Baseline
from specguard.store.records import SeriesState, State, Verdict

CAP = 2.0  # G is held at CAP x h once it alarms


def h_of(detect: Detect, interval: float) -> float:
    return threshold(detect.false_alarm_every / interval) + math.log(detect.tests)


def window_phi_of(detect: Detect, state: DetectorState) -> float:
    """What the window test divides a window's trials by: the windows' own dispersion, not the
    long-run one, since each window is judged alone (1 until the warm-up measured it). A φ given in
    the rule is a long-run one, larger: with it the test only gets stricter."""
    if detect.phi is not None:
        return detect.phi
    return state.warmup.window_phi or 1.0


def condition_of(detect: Detect, interval: float) -> Condition:
    h = h_of(detect, interval)
    return Condition(op=">=", constant=h, text=f"G >= h = {h:.2f}")


def warmup_windows(detect: Detect, interval: float) -> int:
    return max(2, math.ceil(detect.warmup / interval))


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


@dataclass(frozen=True)
class Judged:
    """What the detector makes of one evaluation's answer, before the engine sees it."""

    result: SourceResult  # G per judged series; errors as invalid
    detectors: dict[str, dict[str, Any]]  # series key -> its new detector state
    warming: frozenset[str] = frozenset()  # keys of the series still calibrating
    # Series key -> why its calibration no longer applies and it warms up again.
    recalibrated: dict[str, str] = field(default_factory=dict)
    # Series key -> what the warm-up's check found, for the series whose check found a shift this
    # time and not the time before (said once, not at every window the warm-up slides on).
    unsettled: dict[str, str] = field(default_factory=dict)
    # Series key -> how its warm-up calibrated after checks that found a shift.
    settled: dict[str, str] = field(default_factory=dict)
    # Series key -> why its warm-up so far was let go (a state kept before its windows were).
    restarted: dict[str, str] = field(default_factory=dict)


def judge(
    detect: Detect,
    interval: float,
    answer: SourceResult,
    previous: Mapping[str, SeriesState],
    baseline: Baseline | None,
    now: float,
) -> Judged:
    """Step every series of ``answer`` (token_acceptance over one interval, evaluated at ``now``)
    through its detector."""
    if answer.error is not None:
        return Judged(answer, {})
    h = h_of(detect, interval)
    needed = warmup_windows(detect, interval)
    judged: list[Series] = []
    invalid: list[Invalid] = list(answer.invalid)
    warming: set[str] = set()
    detectors: dict[str, dict[str, Any]] = {}
    recalibrated: dict[str, str] = {}
    said: dict[str, dict[str, str]] = {"unsettled": {}, "settled": {}, "restarted": {}}
    calibration = calibration_of(detect, interval)
    for series in answer.series:
        key = series_key(series.labels)
        old = previous.get(key)
        state = DetectorState.from_json(old.detector if old is not None else None)
        why = recalibration(detect, interval, state.calibration)
        if why is not None:
            # φ (and a learned α0) of other windows would set every Z wrong; G summed them.
            state = DetectorState()
            recalibrated[key] = why
        state.calibration = calibration
        trials = series.trials or 0.0
        if trials < detect.min_trials:
            continue  # too little evidence either way: no data, the statistic as it was
        successes = series.value * trials
        given = _given_in_control(detect, series.labels, baseline)
        if isinstance(given, str):  # said at once, not after an hour of warm-up
            invalid.append(Invalid(dict(series.labels), given))
            continue
        # Neighbours for the autocorrelation: this window follows the last one with data.
        follows = state.seen is not None and now - state.seen <= 1.5 * interval
        state = replace(state, alpha=series.value, trials=trials, seen=now)
        if _warming(detect, state, needed):
            _warm(detect, interval, needed, key, state, (successes, trials, follows), now, said)
            state.in_control = given if given is not None else state.alpha0
            state.in_control_from = _source(detect, given)
            detectors[key] = state.to_json()
            warming.add(key)
            continue
        alpha0 = given if given is not None else state.alpha0
        state.in_control, state.in_control_from = alpha0, _source(detect, given)
        if alpha0 is None:  # learned, yet unknown: a state from before the warm-up was counted
            state = replace(state, warmup=Dispersion(), held=Held())
            detectors[key] = state.to_json()
            warming.add(key)
            continue
        levels = [a for a in detect.shifted(alpha0) if a >= EDGE]  # a fall below 0 cannot happen
        if not levels or any(a >= alpha0 for a in levels):
            invalid.append(
                Invalid(
                    dict(series.labels),
                    f"the in-control acceptance {alpha0:.3f} is not above the ones to detect "
                    f"({', '.join(f'{a:.3f}' for a in detect.shifted(alpha0))}): set in_control, or "
                    "shift_to below it",
                )
            )
            continue
        phi = detect.phi if detect.phi is not None else (state.phi or 1.0)
        before = state.gs if len(state.gs) == len(levels) else [state.g] * len(levels)
        gs = [
            cusum_step(g, llr(successes, trials - successes, alpha0, alpha1) / phi, CAP * h)
            for g, alpha1 in zip(before, levels, strict=True)
        ]
        evidence = None
        if detect.single_window:
            evidence = window_evidence(successes, trials, alpha0, window_phi_of(detect, state))
            if evidence >= h and series.value <= max(levels):
                gs = [CAP * h for _ in gs]  # as a CUSUM that alarmed: held, and resolved the same way
        state = replace(state, gs=gs, g=max(gs), evidence=evidence, windows=state.windows + 1)
        detectors[key] = state.to_json()
        judged.append(Series(dict(series.labels), state.g, trials))
    result = SourceResult(
        series=tuple(judged), detail=answer.detail, invalid=tuple(invalid), warming=answer.warming
    )
    for key in recalibrated:
        if key not in detectors:  # no window with data: the fresh state is kept all the same
            detectors[key] = DetectorState(calibration=calibration).to_json()
    return Judged(
        result,
        detectors,
        frozenset(warming),
        recalibrated,
        unsettled=said["unsettled"],
        settled=said["settled"],
        restarted=said["restarted"],
    )


def _warm(
    detect: Detect,
    interval: float,
    needed: int,
    key: str,
    state: DetectorState,
    window: tuple[float, float, bool],
    now: float,
    said: dict[str, dict[str, str]],
) -> None:
    """One more window into the warm-up; once it holds ``needed`` windows, the check: one level
    calibrates (φ, and α0 when learned), a shift slides the warm-up on, said once in ``said``."""
    if state.warmup.windows != len(state.held):
        # Kept before the warm-up held its windows: sums alone cannot be checked for a shift.
        if state.warmup.windows:
            said["restarted"][key] = (
                f"the {state.warmup.windows} windows of its warm-up so far were kept as sums only, "
                "which cannot be checked for a shift"
            )
        state.warmup, state.held = Dispersion(), Held()
    successes, trials, follows = window
    state.warmup.add(successes, trials, follows)
    state.held.add(now, successes, trials)
    if _warming(detect, state, needed):
        return
    windows = state.held.series(interval)
    result = examine(detect, windows)
    if result is not None and result.shift is not None:
        reason = shift_reason(result, state.held, windows, interval)
        if state.unsettled is None:
            state.unsettled = Unsettled(now, 0, reason)
            said["unsettled"][key] = reason
        state.unsettled.checks += 1
        state.unsettled.reason = reason
        state.homogeneous = False
        state.warmup = slide_past(state.held, windows, result.shift)
        return
    # One level: the warm-up is complete, and the next window is judged.
    state.phi = state.warmup.phi
    if detect.in_control == "learn":
        state.alpha0 = state.warmup.alpha  # kept even when the baseline gives α0: shown beside it
    if state.unsettled is not None:
        checks = state.unsettled.checks
        said["settled"][key] = (
            f"its warm-up holds one level now, after {checks} check{'s' if checks != 1 else ''} "
            f"since {clock(state.unsettled.since)} that found a shift: acceptance "
            f"{state.warmup.alpha or 0.0:.3f}, phi {state.phi or 1.0:.3g}"
        )
    # Checked and one level, or (None) not checked: the rule's levels are not below the median.
    state.homogeneous = True if result is not None else None
    state.unsettled, state.held = None, Held()


def _source(detect: Detect, given: float | None) -> str:
    """Where α0 comes from: the rule's number, the baseline file, or the warm-up."""
    if isinstance(detect.in_control, float | int):
        return "rule"
    return "baseline" if given is not None else "warm-up"


def _warming(detect: Detect, state: DetectorState, needed: int) -> bool:
    """Whether the series still calibrates: φ (unless given) and α0 (when learned) not yet known."""
    calibrated = detect.phi is not None and detect.in_control != "learn"
    return not calibrated and state.warmup.windows < needed


def _given_in_control(
    detect: Detect, labels: Mapping[str, str], baseline: Baseline | None
) -> float | str | None:
    """α0 when it is given (a number, or the baseline file's), why it cannot be had, or None when
    it is learned over the warm-up. ``learn`` prefers the baseline file's token_acceptance for the
    series when there is one: a measured level, which no warm-up can take a collapse for."""
    if isinstance(detect.in_control, float | int):
        return float(detect.in_control)
    if detect.in_control == "learn":
        if baseline is None:
            return None
        measured = baseline.value(labels, DETECT_SIGNAL)
        return measured if isinstance(measured, float) and 0 < measured < 1 else None
    if baseline is None:
        return "in_control: baseline needs a baseline file (`baseline:` in the config)"
    value = baseline.value(labels, DETECT_SIGNAL)
    if isinstance(value, str):
        return f"in_control: baseline: {value}"
    if not 0 < value < 1:
        return f"in_control: baseline: {DETECT_SIGNAL} {value:g} is not in (0, 1)"
    return value


def settle(outcome: Outcome, judged: Judged, previous: Mapping[str, SeriesState], now: float) -> Outcome:
    """The engine's outcome with each series' detector state attached: the new one where the
    detector stepped, the previous one elsewhere; G back to 0 where the series resolved. A series
    still calibrating is *warming up*: the engine saw no value for it, and whatever its no-data
    policy made of that is undone (it neither moves nor fires)."""
    states = dict(outcome.states)
    verdicts = dict(outcome.verdicts)
    events = [e for e in outcome.events if e.series not in judged.warming]
    for key in judged.warming:
        old = previous.get(key) or SeriesState(labels=_labels_of(key))
        states[key] = replace(old, verdict=Verdict.WARMING_UP, error=None, last_eval=now, last_seen=now)
        verdicts[key] = Verdict.WARMING_UP
    for key, detector in judged.detectors.items():
        if key in states:
            states[key] = replace(states[key], detector=dict(detector))
    for event in events:
        state = states.get(event.series)
        if event.kind is State.RESOLVED and state is not None and state.detector is not None:
            gs = [0.0 for _ in state.detector.get("gs") or ()]
            states[event.series] = replace(state, detector={**state.detector, "g": 0.0, "gs": gs})
    forgotten = [key for key in outcome.forgotten if key not in judged.warming]
    return replace(outcome, states=states, verdicts=verdicts, events=events, forgotten=forgotten)


def _labels_of(key: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in json.loads(key).items()}


def shown(state: SeriesState, detect: Detect, interval: float) -> dict[str, Any] | None:
    """What ``eval`` and ``/api/status`` show of a series' detector."""
    if state.detector is None:
        return None
    d = DetectorState.from_json(state.detector)
    needed = warmup_windows(detect, interval)
    alpha0: float | None = d.in_control if d.in_control is not None else d.alpha0
    if isinstance(detect.in_control, float | int):
        alpha0 = float(detect.in_control)
    levels = (
        list(detect.shifted(alpha0 if alpha0 is not None else 0.0))
        if alpha0 is not None or detect.shift_to is not None
        else []
    )
    return {
        "method": detect.method,
        "g": d.g,
        "g_by_level": list(d.gs),
        "h": h_of(detect, interval),
        "phi": detect.phi if detect.phi is not None else d.phi,
        "in_control": alpha0,
        "shift_to": levels,
        "window_alpha": d.alpha,
        "window_trials": d.trials,
        "window_evidence": d.evidence,
        "window_phi": window_phi_of(detect, d) if d.evidence is not None else None,  # what judged it
        "warmup": (
            "none: phi and in_control are given"
            if detect.phi is not None and detect.in_control != "learn"
            else f"{min(d.warmup.windows, needed)}/{needed} windows"
        ),
        "warming_up": _warming(detect, d, needed),
        # Where in_control comes from ("rule", "baseline", "warm-up"), and what the warm-up learned.
        "in_control_from": "rule" if isinstance(detect.in_control, float | int) else d.in_control_from,
        "warmup_alpha": d.alpha0 if detect.in_control == "learn" else None,
        # The warm-up's homogeneity check: passed, found a shift (and what), or not made yet (None).
        "homogeneous": d.homogeneous,
        "not_homogeneous": d.unsettled.status() if d.unsettled is not None else None,
    }
