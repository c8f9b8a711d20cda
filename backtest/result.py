"""What a backtest found, rule by rule, as the text, the JSON and the page show it.

Each rule's replayed events are turned into *episodes* (a series pending, firing, resolved) with the
actions their events ran, were deferred or skipped; the firings the live store recorded are matched
with the replayed ones (``reproduced`` within the plan's resolution); the incidents score them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specguard.backtest.incidents import Episode, Incident, Recorded, Score
from specguard.backtest.judge import Judged
from specguard.backtest.plan import MINUTE, Plan
from specguard.store.records import Event


@dataclass
class RuleResult:
    plan: Plan
    judged: Judged
    episodes: list[Episode] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)  # every run of its events, oldest first
    recorded: list[Recorded] = field(default_factory=list)
    reproduced: list[dict[str, Any]] = field(default_factory=list)  # each recorded firing and its replay
    score: Score | None = None
    calibration: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.plan.name


def episodes_of(
    events: Sequence[Event],
    runs: Mapping[tuple[str, str, str, float], Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, list[Episode]]:
    """Each rule's episodes from the judged events (oldest first); ``runs``: what each event's
    actions did, by (rule, series, kind, moment), for the time to first action."""
    out: dict[str, list[Episode]] = {}
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    for event in events:
        key = (event.rule, event.series)
        kind = event.kind.value
        if kind == "pending":
            open_[key] = {"pending": event.at, "labels": dict(event.labels)}
        elif kind == "firing":
            got = open_.setdefault(key, {"pending": None, "labels": dict(event.labels)})
            got["fired"] = event.at
            got["action"] = first_action((runs or {}).get((*key, kind, event.at), []))
        elif kind in ("resolved", "inactive"):
            got = open_.pop(key, {})
            if "fired" in got:
                out.setdefault(key[0], []).append(_episode(key, got, event.at))
    for key, got in open_.items():
        if "fired" in got:
            out.setdefault(key[0], []).append(_episode(key, got, None))
    for episodes in out.values():
        episodes.sort(key=lambda e: e.fired)
    return out


def _episode(key: tuple[str, str], got: Mapping[str, Any], resolved: float | None) -> Episode:
    return Episode(key[0], key[1], got["labels"], got["pending"], got["fired"], resolved, got.get("action"))


def first_action(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """When the first of a firing's actions that did something finished (a hold of a flag already
    engaged by another series counts: the fallback was in force)."""
    done = [r["finished"] for r in runs if r["status"] in ("ok", "hold") and r["finished"] is not None]
    return min(done) if done else None


def duration(episode: Episode, end: float) -> float:
    return (episode.resolved if episode.resolved is not None else end) - episode.fired


def reproduce(recorded: Sequence[Recorded], episodes: Sequence[Episode], plan: Plan) -> list[dict[str, Any]]:
    """Each recorded firing with the replay's firing of the same series nearest to it; ``within``
    says whether it is within the plan's resolution (a minute, or the replayed interval)."""
    slack = max(MINUTE, plan.every)
    out = []
    taken: set[int] = set()
    for firing in recorded:
        same = [
            (abs(e.fired - firing.fired), i)
            for i, e in enumerate(episodes)
            if i not in taken and all(e.labels.get(k) == v for k, v in firing.labels.items())
        ]
        best = min(same, default=None)
        replayed = episodes[best[1]].fired if best is not None and best[0] <= 6 * slack else None
        if best is not None and replayed is not None:
            taken.add(best[1])
        out.append({
            "labels": dict(firing.labels),
            "recorded": firing.fired,
            "replayed": replayed,
            "difference": None if replayed is None else replayed - firing.fired,
            "within": replayed is not None and abs(replayed - firing.fired) <= slack,
        })  # fmt: skip
    return out


def as_json(result: RuleResult, end: float, incidents: Sequence[Incident]) -> dict[str, Any]:
    plan, judged = result.plan, result.judged
    out: dict[str, Any] = {
        "rule": plan.name,
        "signal": plan.item.rule.signal,
        "every_live": plan.live_every,
        "every_replayed": plan.every,
        "skipped": plan.skip,
        "notes": list(plan.notes),
        "evaluations": judged.evaluations,
        "errors": [{"error": e, "evaluations": n} for e, n in judged.errors.items()],
        "series": len(judged.traces),
        "firings": len(result.episodes),
        "minutes_firing": round(sum(duration(e, end) for e in result.episodes) / MINUTE, 1),
        "episodes": [
            {
                "labels": dict(e.labels),
                "pending": e.pending,
                "fired": e.fired,
                "resolved": e.resolved,
                "minutes": round(duration(e, end) / MINUTE, 1),
                "first_action": e.first_action,
            }
            for e in result.episodes
        ],
        "actions": result.actions,
        "action_counts": counts(result.actions),
    }
    if result.recorded or result.reproduced:
        out["reproduced"] = result.reproduced
    if result.score is not None:
        s = result.score
        out["incidents"] = {
            "concerned": s.incidents,
            "caught": s.caught,
            "missed": [
                {"start": i.start, "end": i.end, "match": dict(i.match), "note": i.note} for i in s.missed
            ],
            "false_alarms": [
                {"labels": dict(e.labels), "fired": e.fired, "resolved": e.resolved} for e in s.false_alarms
            ],
            "delays": s.delays,
            "median_to_firing": _median([d["to_firing"] for d in s.delays]),
            "median_to_action": _median([d["to_action"] for d in s.delays if d["to_action"] is not None]),
        }
    if result.calibration is not None:
        out["calibration"] = result.calibration
    return out


def counts(actions: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per action, how many runs ended each way (ok, deferred, skipped, hold...)."""
    out: dict[str, dict[str, int]] = {}
    for run in actions:
        by = out.setdefault(run["action"], {})
        status = run["status"] if run["mode"] != "restore" else f"restore {run['status']}"
        by[status] = by.get(status, 0) + 1
    return out


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(v for v in values if v is not None and math.isfinite(v))
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
