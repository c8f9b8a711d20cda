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

The engine (``engine.states``, which ``evaluate`` here calls in turn) then sees the value G
against the threshold h = ln(false_alarm_every / interval) with the condition ``G >= h`` (h + ln(n)
with n tests, the levels and the window test: a union bound keeps the false-alarm target for all of
them together): pending, firing, ``for`` and the no-data policy work as for any rule. When the
series resolves, G starts again from 0. Everything lives in the series' ``detector`` state, which
the store keeps: a restart neither forgets the calibration nor the evidence so far.

A calibration holds only for the windows it was measured on: a series whose state was calibrated
under other settings warms up again, said once with the reason (``engine.detector_state``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from specguard.common.evolve import evolve
from specguard.common.sequential import EDGE, Dispersion, cusum_step, llr, threshold, window_evidence
from specguard.engine import states as machine
from specguard.engine.detector_state import DetectorState, calibration_of, recalibration
from specguard.engine.states import Outcome, RuleSpec, series_key
from specguard.engine.warmup import Held, Unsettled, clock, examine, shift_reason, slide_past
from specguard.rules.conditions import Condition
from specguard.rules.schema import DETECT_SIGNAL, Detect
from specguard.sources.base import Invalid, Series, SourceResult
from specguard.store.baseline import Baseline
from specguard.store.records import SCHEDULE, SeriesState, State, Verdict

CAP = 2.0  # G is held at CAP x h once it alarms
# At most this many warm-ups are checked for one level in one evaluation (a check decodes the
# warm-up's windows, an hour of them, and runs a CUSUM each way over them: a few milliseconds).
# Series that started together end their warm-ups together: a central watch's thousand series
# would all be checked in the same round, which then took 2.8 s of its 5 s; past this many, those
# whose warm-up has waited longest go first and the rest wait for the next window, still warming up
# (benchmarks/results/fleet_prometheus.md).
CHECKS_PER_EVALUATION = 50


def _h_of(detect: Detect, interval: float) -> float:
    return threshold(detect.false_alarm_every / interval) + math.log(detect.tests)


def window_phi_of(detect: Detect, state: DetectorState) -> float:
    """What the window test divides a window's trials by: the windows' own dispersion, not the
    long-run one, since each window is judged alone (1 until the warm-up measured it). A φ given in
    the rule is a long-run one, larger: with it the test only gets stricter."""
    if detect.phi is not None:
        return detect.phi
    return state.warmup.window_phi or 1.0


def condition_of(detect: Detect, interval: float) -> Condition:
    h = _h_of(detect, interval)
    return Condition(op=">=", constant=h, text=f"G >= h = {h:.2f}")


def warmup_windows(detect: Detect, interval: float) -> int:
    return max(2, math.ceil(detect.warmup / interval))


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


def evaluate(
    detect: Detect,
    interval: float,
    spec: RuleSpec,
    answer: SourceResult,
    previous: Mapping[str, SeriesState],
    baseline: Baseline | None,
    now: float,
    trigger: str = SCHEDULE,
) -> tuple[Outcome, Judged]:
    """One evaluation of a ``detect:`` rule (``spec``: its condition G >= h): every series'
    detector steps on ``answer`` (``judge``), the engine judges their statistics against h, and the
    detectors' new states are attached to its outcome (``_settle``). The Judged says what the
    warm-ups found, for the caller to tell."""
    judged = judge(detect, interval, answer, previous, baseline, now)
    outcome = machine.evaluate(spec, judged.result, _h_of(detect, interval), previous, now, trigger)
    return _settle(outcome, judged, previous, now), judged


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
    h = _h_of(detect, interval)
    needed = warmup_windows(detect, interval)
    judged: list[Series] = []
    invalid: list[Invalid] = list(answer.invalid)
    warming: set[str] = set()
    detectors: dict[str, dict[str, Any]] = {}
    recalibrated: dict[str, str] = {}
    said: dict[str, dict[str, str]] = {"unsettled": {}, "settled": {}, "restarted": {}}
    calibration = calibration_of(detect, interval)
    read: list[tuple[Series, str, DetectorState]] = []
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
        read.append((series, key, state))
    checked = _checked_now(detect, needed, read)
    for series, key, state in read:
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
        state = evolve(state, alpha=series.value, trials=trials, seen=now)
        if _warming(detect, state, needed):
            window = (successes, trials, follows)
            _warm(detect, interval, needed, key, state, window, now, said, key in checked)
            state.in_control = given if given is not None else state.alpha0
            state.in_control_from = _source(detect, given)
            detectors[key] = state.to_json()
            warming.add(key)
            continue
        alpha0 = given if given is not None else state.alpha0
        state.in_control, state.in_control_from = alpha0, _source(detect, given)
        if alpha0 is None:  # learned, yet unknown: a state from before the warm-up was counted
            state = evolve(state, warmup=Dispersion(), held=Held())
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
        state = evolve(state, gs=gs, g=max(gs), evidence=evidence, windows=state.windows + 1)
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
    may_check: bool = True,
) -> None:
    """One more window into the warm-up; once it holds ``needed`` windows, the check (when this
    evaluation ``may_check`` it; else at a later one): one level calibrates (φ, and α0 when
    learned), a shift slides the warm-up on, said once in ``said``."""
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
    if state.warmup.windows < needed or not may_check:
        return
    windows = state.held.series(interval)
    if windows is None:  # numbers that are not numbers: nothing to check them with
        said["restarted"][key] = f"the {len(state.held)} windows of its warm-up were not read back as numbers"
        state.warmup, state.held = Dispersion(), Held()
        state.warmup.add(successes, trials, follows)
        state.held.add(now, successes, trials)
        return
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
    """Whether the series still calibrates: φ (unless given) and α0 (when learned) not yet known.
    A warm-up that has its windows and still holds them waits for its check."""
    calibrated = detect.phi is not None and detect.in_control != "learn"
    return not calibrated and (state.warmup.windows < needed or len(state.held) > 0)


def _checked_now(detect: Detect, needed: int, read: list[tuple[Series, str, DetectorState]]) -> set[str]:
    """The series whose warm-up may be checked in this evaluation: of those due (a window with data
    brings them to ``needed``), at most ``CHECKS_PER_EVALUATION``, those that have waited longest
    first (the most windows), then by key."""
    due = [
        (-state.warmup.windows, key)
        for series, key, state in read
        if (series.trials or 0.0) >= detect.min_trials
        and _warming(detect, state, needed)
        and state.warmup.windows + 1 >= needed
    ]
    if len(due) <= CHECKS_PER_EVALUATION:
        return {key for _, key in due}
    return {key for _, key in sorted(due)[:CHECKS_PER_EVALUATION]}


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


def _settle(outcome: Outcome, judged: Judged, previous: Mapping[str, SeriesState], now: float) -> Outcome:
    """The engine's outcome with each series' detector state attached: the new one where the
    detector stepped, the previous one elsewhere; G back to 0 where the series resolved. A series
    still calibrating is *warming up*: the engine saw no value for it, and whatever its no-data
    policy made of that is undone (it neither moves nor fires)."""
    states = dict(outcome.states)
    verdicts = dict(outcome.verdicts)
    events = [e for e in outcome.events if e.series not in judged.warming]
    for key in judged.warming:
        old = previous.get(key) or SeriesState(labels=_labels_of(key))
        states[key] = evolve(old, verdict=Verdict.WARMING_UP, error=None, last_eval=now, last_seen=now)
        verdicts[key] = Verdict.WARMING_UP
    for key, detector in judged.detectors.items():
        if key in states:
            states[key] = evolve(states[key], detector=dict(detector))
    for event in events:
        state = states.get(event.series)
        if event.kind is State.RESOLVED and state is not None and state.detector is not None:
            gs = [0.0 for _ in state.detector.get("gs") or ()]
            states[event.series] = evolve(state, detector={**state.detector, "g": 0.0, "gs": gs})
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
        "h": _h_of(detect, interval),
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
            + (", waiting for its check" if d.warmup.windows >= needed and len(d.held) else "")
        ),
        "warming_up": _warming(detect, d, needed),
        # Where in_control comes from ("rule", "baseline", "warm-up"), and what the warm-up learned.
        "in_control_from": "rule" if isinstance(detect.in_control, float | int) else d.in_control_from,
        "warmup_alpha": d.alpha0 if detect.in_control == "learn" else None,
        # The warm-up's homogeneity check: passed, found a shift (and what), or not made yet (None).
        "homogeneous": d.homogeneous,
        "not_homogeneous": d.unsettled.status() if d.unsettled is not None else None,
    }
