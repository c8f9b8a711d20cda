"""What the firings are scored against: incidents an operator marks, and what the daemon recorded.

An incidents file lists known incidents (``--incidents FILE``)::

    incidents:
      - start: 2026-12-01T14:00:00Z
        end: 2026-12-01T15:30:00Z
        match: {instance: "vllm-a:8000"}   # the series it concerns (default: every series)
        rules: ["acceptance_*"]            # the rules that should catch it (default: every rule)
        note: draft v2 collapsed on code prompts

A firing *catches* an incident when its series matches and it is firing at some moment of the
incident; an incident no firing of a rule caught is *missed* by that rule; a firing that catches no
incident of its rule is a *false alarm*. A label the rule's series do not carry (the rule sums over
it) does not count against the match.

The daemon's own record (``recorded``) is the firings the live store holds over the period: a
backtest of the same rules must reproduce each at the same minute, and a changed rule shows which it
would have lost or added.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from specguard.common.yamlfile import FileProblems, LineDict, Problem, line_of, load_yaml, validation_problems
from specguard.store.connection import read_only


class _Incident(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    start: AwareDatetime
    end: AwareDatetime
    match: dict[str, str] = Field(default_factory=dict)
    rules: list[str] = Field(default_factory=list)
    note: str = ""

    @model_validator(mode="after")
    def _order(self) -> _Incident:
        if not self.end > self.start:
            raise ValueError("end must come after start")
        return self


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    incidents: list[_Incident]


@dataclass(frozen=True)
class Incident:
    start: float
    end: float
    match: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[str, ...] = ()  # globs; empty: every rule
    note: str = ""
    origin: str = "file"  # file | recorded (the live store's firing of a rule)

    def concerns(self, rule: str, labels: Mapping[str, str]) -> bool:
        """Whether a firing of ``rule`` on ``labels`` is about this incident."""
        if self.rules and not any(fnmatch.fnmatchcase(rule, glob) for glob in self.rules):
            return False
        return all(labels.get(k, v) == v for k, v in self.match.items())


def load(path: Path) -> list[Incident]:
    """The incidents of ``path``. Raises FileProblems naming the file, line and field."""
    data = load_yaml(path)
    label = str(path)
    if not isinstance(data, dict):
        raise FileProblems(
            [
                Problem(
                    label, line_of(data, ()), "", "an incidents file is a mapping with an `incidents:` list"
                )
            ]
        )
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        raise FileProblems(
            validation_problems(label, data if isinstance(data, LineDict) else LineDict(data), exc)
        ) from None
    return [
        Incident(i.start.timestamp(), i.end.timestamp(), dict(i.match), tuple(i.rules), i.note)
        for i in parsed.incidents
    ]


@dataclass(frozen=True)
class Recorded:
    """A firing the live daemon recorded: its rule and series, when it fired and resolved."""

    rule: str
    labels: Mapping[str, str]
    fired: float
    resolved: float | None  # None: still firing at the period's end

    def as_incident(self, end: float) -> Incident:
        return Incident(self.fired, self.resolved if self.resolved is not None else end, dict(self.labels),
                        (self.rule,), "recorded live", "recorded")  # fmt: skip


def recorded(store: Path, start: float, end: float) -> list[Recorded]:
    """The firings the live store recorded in [start, end), oldest first (one still firing at
    ``end`` has no resolution). An unreadable store has none (said by the caller)."""
    try:
        with contextlib.closing(read_only(store)) as db:
            rows = db.execute(
                "SELECT rule, series, labels, kind, at FROM events WHERE at < ? ORDER BY at, id", (end,)
            ).fetchall()
    except sqlite3.Error:
        return []
    open_: dict[tuple[str, str], tuple[dict[str, str], float]] = {}
    out: list[Recorded] = []
    for row in rows:
        key = (row["rule"], row["series"])
        if row["kind"] == "firing":
            open_[key] = (json.loads(row["labels"]), float(row["at"]))
        elif row["kind"] in ("resolved", "inactive") and key in open_:
            labels, fired = open_.pop(key)
            if float(row["at"]) > start:
                out.append(Recorded(row["rule"], labels, fired, float(row["at"])))
    out += [Recorded(rule, labels, fired, None) for (rule, _), (labels, fired) in open_.items()]
    return sorted(
        (r for r in out if r.fired < end and (r.resolved is None or r.resolved > start)),
        key=lambda r: r.fired,
    )


@dataclass(frozen=True)
class Episode:
    """One firing of one series in the replay: from its firing to its resolution (None: still
    firing at the period's end), and when its first action ran."""

    rule: str
    series: str
    labels: Mapping[str, str]
    pending: float | None
    fired: float
    resolved: float | None
    first_action: float | None = None

    def overlaps(self, start: float, end: float, period_end: float) -> bool:
        stop = self.resolved if self.resolved is not None else period_end
        return self.fired < end and stop > start


@dataclass
class Score:
    """One rule's firings against the incidents that concern it."""

    incidents: int = 0
    caught: int = 0
    missed: list[Incident] = field(default_factory=list)
    false_alarms: list[Episode] = field(default_factory=list)
    delays: list[dict[str, Any]] = field(default_factory=list)  # per caught incident: to firing, to action


def score(rule: str, episodes: Sequence[Episode], incidents: Sequence[Incident], period_end: float) -> Score:
    out = Score()
    caught_by: set[int] = set()
    for number, incident in enumerate(incidents):
        if incident.rules and not any(fnmatch.fnmatchcase(rule, glob) for glob in incident.rules):
            continue  # another rule's incident
        out.incidents += 1
        mine = [
            e for e in episodes
            if incident.concerns(rule, e.labels) and e.overlaps(incident.start, incident.end, period_end)
        ]  # fmt: skip
        if not mine:
            out.missed.append(incident)
            continue
        out.caught += 1
        caught_by.update(id(e) for e in mine)
        first = min(e.fired for e in mine)
        acted = [e.first_action for e in mine if e.first_action is not None]
        out.delays.append({
            "incident": number,
            "start": incident.start,
            "to_firing": max(0.0, first - incident.start),
            "to_action": max(0.0, min(acted) - incident.start) if acted else None,
        })  # fmt: skip
    for episode in episodes:
        if id(episode) in caught_by:
            continue
        if not any(
            i.concerns(rule, episode.labels) and episode.overlaps(i.start, i.end, period_end)
            for i in incidents
        ):
            out.false_alarms.append(episode)
    return out
