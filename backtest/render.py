"""A backtest as text (a table per run, the firings of each rule, what history cannot replay) and
as JSON; two runs side by side for ``--compare``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from specguard.backtest.result import as_json, counts, duration
from specguard.backtest.run import Backtest
from specguard.rules.durations import format_duration


def moment(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def span(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(round(seconds))


def to_json(run: Backtest, label: str = "") -> dict[str, Any]:
    return {
        "rules_file": label,
        "start": run.start,
        "end": run.end,
        "source": run.source,
        "notes": run.notes,
        "silences_copied": run.silences,
        "flags": {
            name: [{"at": at, "change": what} for at, what in changes] for name, changes in run.flags.items()
        },
        "incidents": [
            {"start": i.start, "end": i.end, "match": dict(i.match), "rules": list(i.rules), "note": i.note}
            for i in run.incidents
        ],
        "rules": [as_json(r, run.end, run.incidents) for r in run.rules],
        "totals": totals(run),
    }


def as_text_json(runs: Sequence[tuple[str, Backtest]]) -> str:
    if len(runs) == 1:
        return json.dumps(to_json(runs[0][1], runs[0][0]), indent=2) + "\n"
    return json.dumps({"compare": [to_json(run, label) for label, run in runs]}, indent=2) + "\n"


def totals(run: Backtest) -> dict[str, Any]:
    """The run's figures over every rule replayed: what ``--compare`` sets side by side."""
    rules = [r for r in run.rules if r.plan.skip is None]
    actions = [a for r in rules for a in r.actions]
    scores = [r.score for r in rules if r.score is not None]
    delays = [d for s in scores for d in s.delays]
    firing = [d["to_firing"] for d in delays]
    acting = [d["to_action"] for d in delays if d["to_action"] is not None]
    return {
        "rules": len(rules),
        "skipped": len(run.rules) - len(rules),
        "firings": sum(len(r.episodes) for r in rules),
        "minutes_firing": round(sum(duration(e, run.end) for r in rules for e in r.episodes) / 60, 1),
        "actions": counts(actions),
        "incidents": sum(s.incidents for s in scores),
        "caught": sum(s.caught for s in scores),
        "missed": sum(len(s.missed) for s in scores),
        "false_alarms": sum(len(s.false_alarms) for s in scores),
        "median_to_firing": _median(firing),
        "median_to_action": _median(acting),
        "reproduced": sum(1 for r in rules for x in r.reproduced if x["within"]),
        "recorded": sum(len(r.reproduced) for r in rules),
    }


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _actions(by: Mapping[str, Mapping[str, int]]) -> str:
    if not by:
        return "-"
    return "; ".join(
        f"{name} " + ", ".join(f"{n} {status}" for status, n in sorted(s.items()))
        for name, s in sorted(by.items())
    )


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def text(run: Backtest, label: str = "") -> str:
    head = (
        f"backtest of {label or 'the rules'}: {moment(run.start)} to {moment(run.end)} UTC "
        f"({span(run.end - run.start)}), from {run.source}"
    )
    lines = [head, ""]
    rows = [
        [
            "RULE",
            "EVERY",
            "FIRINGS",
            "MIN FIRING",
            "INCIDENTS",
            "MISSED",
            "FALSE",
            "TO FIRING",
            "TO ACTION",
            "ACTIONS",
        ]
    ]
    for r in run.rules:
        if r.plan.skip is not None:
            rows.append([r.name, "-", "-", "-", "-", "-", "-", "-", "-", "not replayed"])
            continue
        every = span(r.plan.every) + (
            f" ({span(r.plan.live_every)} live)" if r.plan.every != r.plan.live_every else ""
        )
        s = r.score
        delays = s.delays if s is not None else []
        rows.append([
            r.name, every, str(len(r.episodes)),
            f"{sum(duration(e, run.end) for e in r.episodes) / 60:.1f}",
            f"{s.caught} of {s.incidents}" if s is not None else "-",
            str(len(s.missed)) if s is not None else "-",
            str(len(s.false_alarms)) if s is not None else "-",
            span(_median([d["to_firing"] for d in delays])),
            span(_median([d["to_action"] for d in delays if d["to_action"] is not None])),
            _actions(counts(r.actions)),
        ])  # fmt: skip
    lines += _table(rows)
    for r in run.rules:
        lines += ["", f"{r.name}:"]
        if r.plan.skip is not None:
            lines.append(f"  not replayed: {r.plan.skip}")
            continue
        for e in r.episodes:
            labels = ",".join(f"{k}={v}" for k, v in sorted(e.labels.items()))
            lines.append(
                f"  {labels}: pending {moment(e.pending)}, firing {moment(e.fired)}, "
                + (f"resolved {moment(e.resolved)}" if e.resolved is not None else "still firing at the end")
                + f" ({span(duration(e, run.end))})"
            )
            lines += [f"    {line}" for line in _runs_of(r.actions, e)]
        if not r.episodes:
            lines.append(
                f"  no firing in {r.judged.evaluations} evaluations of {len(r.judged.traces)} series"
            )
        for x in r.reproduced:
            labels = ",".join(f"{k}={v}" for k, v in sorted(x["labels"].items()))
            if x["replayed"] is None:
                lines.append(f"  recorded live {moment(x['recorded'])} ({labels}): NOT reproduced")
            else:
                sign = "+" if x["difference"] >= 0 else "-"
                lines.append(
                    f"  recorded live {moment(x['recorded'])} ({labels}): replayed {moment(x['replayed'])} "
                    f"({sign}{span(abs(x['difference']))}){'' if x['within'] else ', outside the resolution'}"
                )
        if r.score is not None:
            for i in r.score.missed:
                where = ",".join(f"{k}={v}" for k, v in sorted(i.match.items())) or "every series"
                lines.append(
                    f"  MISSED incident {moment(i.start)} to {moment(i.end)} ({where}){': ' + i.note if i.note else ''}"
                )
            for e in r.score.false_alarms:
                labels = ",".join(f"{k}={v}" for k, v in sorted(e.labels.items()))
                lines.append(f"  FALSE ALARM {moment(e.fired)} ({labels})")
        for error, n in r.judged.errors.items():
            lines.append(f"  error in {n} evaluations: {error}")
        for note in r.plan.notes:
            lines.append(f"  note: {note}")
        if r.calibration is not None:
            lines.append(f"  calibration: {r.calibration['said']}")
    if run.silences:
        lines += ["", f"{run.silences} silence(s) recorded live over the period were applied"]
    for note in run.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _runs_of(actions: Sequence[Mapping[str, Any]], episode: Any) -> list[str]:
    """What the actions did for one episode: the runs of its firing and of its resolution, when
    each ended (a restore after its quiet period), or why it did not run."""
    lines = []
    for run in actions:
        if dict(run["labels"]) != dict(episode.labels):
            continue
        if not (
            run["at"] == episode.fired or (episode.resolved is not None and run["at"] == episode.resolved)
        ):
            continue
        when = run["finished"] if run["finished"] is not None else run.get("not_before") or run["at"]
        what = run["action"] + (" restore" if run["mode"] == "restore" else "")
        for held in run.get("held", ()):
            until = f" until {moment(held['until'])}" if held["until"] is not None else ""
            lines.append(f"{moment(held['at'])} {what} {held['status']}{until}: {held['reason']}")
        why = run.get("detail") or run.get("reason") or ""
        lines.append(f"{moment(when)} {what} {run['status']}" + (f": {why}" if why else ""))
    return lines


def compared(runs: Sequence[tuple[str, Backtest]]) -> str:
    """Two runs' totals side by side, then each run in full."""
    figures = [totals(run) for _, run in runs]
    rows = [["", *(label for label, _ in runs)]]
    for name, key in (
        ("rules replayed", "rules"),
        ("firings", "firings"),
        ("minutes firing", "minutes_firing"),
        ("incidents caught", "caught"),
        ("incidents missed", "missed"),
        ("false alarms", "false_alarms"),
    ):
        rows.append([name, *(str(f[key]) for f in figures)])
    rows.append(["median to firing", *(span(f["median_to_firing"]) for f in figures)])
    rows.append(["median to action", *(span(f["median_to_action"]) for f in figures)])
    rows.append(["actions", *(_actions(f["actions"]) for f in figures)])
    out = ["side by side:", *_table(rows), ""]
    for label, run in runs:
        out += ["", text(run, label)]
    return "\n".join(out)
