"""A collapse detector's calibration on the period: its false alarms, and the φ that keeps them at the
configured rate.

``false_alarm_every`` sets the rate a detector may raise false alarms at (30d: none in a week). Its
false alarms on the period are its firings that caught no incident (``incidents.py``; with no
incident known, every firing counts). When there are more than the rate allows, the detector's
long-run dispersion φ was too small for this traffic: every statistic it computes is divided by φ,
so a larger φ raises fewer alarms. The proposal is found by replaying the rule alone with ``phi``
fixed, from the largest φ its series learned (or the rule's own), growing by a quarter until the
false alarms are within the rate; the φ proposed is the one replayed, so its count is measured,
never predicted. It is shown as the φ, and as the h it amounts to at the learned φ (h x φ'/φ).

``--write FILE`` writes the rules file with ``phi:`` set in that rule's ``detect:`` (and a comment
saying where it came from), checked to load before it is written; the live rules file is never
written.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specguard.backtest import judge
from specguard.backtest.incidents import Incident, score
from specguard.backtest.plan import Plan
from specguard.backtest.result import RuleResult, episodes_of
from specguard.backtest.run import Backtest
from specguard.common.files import write_atomically
from specguard.common.yamlfile import FileProblems, LineDict, LineList, load_yaml
from specguard.config.loading import Loaded
from specguard.engine import detection
from specguard.rules.durations import format_duration

GROWTH = 1.25
MOST_TRIES = 24  # φ up to 1.25^24 = 211 times the learned one


async def calibrate(run: Backtest, loaded: Loaded) -> None:
    """Each replayed detector's calibration, set on its ``RuleResult``. Needs the source the run
    read: replays the rule again through it when a φ must be found."""
    for result in run.rules:
        detect = result.plan.item.rule.detect
        if detect is None or result.plan.skip is not None:
            continue
        result.calibration = await _one(run, result, loaded)


def _allowed(period: float, every: float) -> int:
    return math.floor(period / every + 1e-9)


def _false_alarms(result: RuleResult, incidents: Sequence[Incident], end: float) -> int:
    if result.score is not None:
        return len(result.score.false_alarms)
    return len(result.episodes) if not incidents else 0


def _learned(result: RuleResult) -> float | None:
    phis = [
        float(s.detector["phi"])
        for s in result.judged.final.values()
        if s.detector is not None and isinstance(s.detector.get("phi"), int | float)
    ]
    return max(phis) if phis else None


async def _one(run: Backtest, result: RuleResult, loaded: Loaded) -> dict[str, Any]:
    plan = result.plan
    detect = plan.item.rule.detect
    assert detect is not None
    period = run.end - run.start
    allowed = _allowed(period, detect.false_alarm_every)
    incidents = _incidents(run, result)
    found = _false_alarms(result, incidents, run.end)
    h = detection.condition_of(detect, plan.every).threshold(None)
    learned = detect.phi if detect.phi is not None else _learned(result)
    out: dict[str, Any] = {
        "false_alarms": found,
        "allowed": allowed,
        "false_alarm_every": detect.false_alarm_every,
        "phi": learned,
        "phi_from": "rule" if detect.phi is not None else "warm-up",
        "h": h,
        "counted_as": "firings that caught no incident" if incidents else "every firing (no incident known)",
    }
    rate = f"at most {allowed} in {format_duration(period)} (one per {format_duration(detect.false_alarm_every)})"
    if found <= allowed:
        out["proposed_phi"] = None
        out["said"] = (
            f"{found} false alarm(s), {rate}: phi {_num(learned)} and h {h:.2f} hold on this traffic"
        )
        return out
    if learned is None:
        out["proposed_phi"] = None
        out["said"] = (
            f"{found} false alarm(s), {rate}; no phi was learned (the warm-up never ended): none to propose"
        )
        return out
    phi = learned
    for _ in range(MOST_TRIES):
        phi = math.ceil(phi * GROWTH * 10) / 10
        tried = await _replay_with(run, result, loaded, phi)
        count = tried if isinstance(tried, int) else None
        if count is None:
            out["said"] = f"{found} false alarm(s), {rate}; the replay with a larger phi failed: {tried}"
            out["proposed_phi"] = None
            return out
        if count <= allowed:
            out["proposed_phi"] = phi
            out["proposed_false_alarms"] = count
            out["proposed_h_at_learned_phi"] = h * phi / learned
            out["said"] = (
                f"{found} false alarm(s), {rate}: phi {_num(phi)} instead of {_num(learned)} gives {count} on "
                f"the same traffic; at phi {_num(learned)} that is h {h * phi / learned:.2f} instead of {h:.2f}"
            )
            return out
    out["proposed_phi"] = None
    out["said"] = f"{found} false alarm(s), {rate}; no phi up to {_num(phi)} brings them within it"
    return out


def _incidents(run: Backtest, result: RuleResult) -> list[Incident]:
    return [*run.incidents, *(r.as_incident(run.end) for r in result.recorded)]


async def _replay_with(run: Backtest, result: RuleResult, loaded: Loaded, phi: float) -> int | str:
    """The false alarms of ``result``'s rule replayed alone with ``phi`` fixed (judged only: the
    firings, not the actions)."""
    plan = result.plan
    detect = plan.item.rule.detect
    assert detect is not None
    rule = plan.item.rule.model_copy(update={"detect": detect.model_copy(update={"phi": phi})})
    fixed = Plan(dataclasses.replace(plan.item, rule=rule), plan.live_every, plan.every, plan.notes)
    source, set_clock = run.replay_source()
    judged = await judge.judge(fixed, source, loaded.baseline, run.start, run.end - 1e-6, set_clock)
    episodes = episodes_of(judged.events).get(plan.name, [])
    incidents = _incidents(run, result)
    if not incidents:
        return len(episodes)
    return len(score(plan.name, episodes, incidents, run.end).false_alarms)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def write(run: Backtest, rules_file: Path, out: Path) -> str:
    """``rules_file`` with each proposed φ set, written to ``out``; what was done, in one line."""
    proposals = {
        r.name: r.calibration["proposed_phi"]
        for r in run.rules
        if r.calibration is not None and r.calibration.get("proposed_phi") is not None
    }
    if not proposals:
        return f"specguard backtest: --write: nothing to propose: {out} not written"
    text = rules_file.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    data = load_yaml(rules_file, text)
    rules = data.get("rules") if isinstance(data, LineDict) else None
    assert isinstance(rules, LineList)
    edits: list[tuple[int, str | None, str]] = []  # (0-based line, replaced key or None: insert, text)
    for item in rules:
        if not isinstance(item, LineDict) or item.get("name") not in proposals:
            continue
        detect = item.get("detect")
        if not isinstance(detect, LineDict) or not detect.key_lines:
            continue
        phi = proposals[item["name"]]
        note = f"  # proposed by specguard backtest ({_period(run)})"
        if "phi" in detect.key_lines:
            at = detect.key_lines["phi"] - 1
            indent = re.match(r"\s*", lines[at]).group(0)  # type: ignore[union-attr]
            edits.append((at, "phi", f"{indent}phi: {phi:g}{note}\n"))
        else:
            first = min(detect.key_lines.values()) - 1
            indent = re.match(r"\s*", lines[first]).group(0)  # type: ignore[union-attr]
            edits.append((first, None, f"{indent}phi: {phi:g}{note}\n"))
    for at, key, line in sorted(edits, reverse=True):
        if key is None:
            lines.insert(at, line)
        else:
            lines[at] = line
    proposed = "".join(lines)
    try:
        load_yaml(out, proposed)
    except FileProblems as exc:  # pragma: no cover - an edit of a file that loaded must load
        return (
            f"specguard backtest: --write: the proposal does not load ({exc.problems[0]}): {out} not written"
        )
    write_atomically(out, proposed)
    names = ", ".join(f"{name} phi {phi:g}" for name, phi in sorted(proposals.items()))
    return f"specguard backtest: wrote {out} ({names}); {rules_file} is unchanged"


def _period(run: Backtest) -> str:
    from datetime import UTC, datetime

    def day(at: float) -> str:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")

    return f"{day(run.start)} to {day(run.end)} UTC"
