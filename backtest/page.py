"""The backtest's page (``--html FILE``): per rule and series, a timeline of what the replay saw.

One HTML file that needs nothing but itself, as the weekly report's: the same blocks
(``report/document.py``), written by the same code (``report/to_html.py``: every piece of text
escaped, the charts inlined as data: URIs) under the same Content-Security-Policy, so that labels
from vLLM's metrics cannot inject markup and the page can be mailed or attached to a ticket. Each
series' timeline is drawn by the report's charts (``report/charts.py``, matplotlib, optional):
without matplotlib the page still has every table and says why the charts are missing.

A rule over a fleet may have hundreds of series; only the ``MOST_CHARTS`` that were firing or
pending longest are drawn (each is some 30 KB), the rest are in the series' table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specguard.backtest import render
from specguard.backtest.judge import STATES, Trace
from specguard.backtest.render import totals
from specguard.backtest.result import RuleResult, duration
from specguard.backtest.run import Backtest
from specguard.common.files import write_atomically
from specguard.report import charts, to_html
from specguard.report.document import Block, Cell, Heading, Image, Items, Paragraph, Table
from specguard.report.values import MISSING
from specguard.store.records import State

MOST_CHARTS = 12  # per rule and run
MOST_ROWS = 500  # of a rule's action runs; the JSON has every one

_PENDING = STATES.index(State.PENDING)
_FIRING = STATES.index(State.FIRING)
_SOURCES = {"history": "the state database's per-minute history", "prometheus": "Prometheus"}


@dataclass
class _Page:
    """The page as it is built: its blocks, and each chart's PNG and alt text by name."""

    blocks: list[Block] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)
    alts: dict[str, str] = field(default_factory=dict)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)


def write_page(path: Path, runs: Sequence[tuple[str, Backtest]]) -> None:
    """Write the page of ``runs`` (one, or two to compare; each with its rules file's name) to
    ``path``, atomically: a reader sees the old page or the new one. Raises OSError."""
    write_atomically(path, page(runs), keep_previous=False)


def page(runs: Sequence[tuple[str, Backtest]]) -> str:
    """The page of ``runs`` as one HTML document."""
    if not runs:
        raise ValueError("a backtest page needs at least one run")
    missing = charts.available()
    title = "specguard backtest: " + " against ".join(label or "the rules" for label, _ in runs)
    out = _Page()
    first = runs[0][1]
    out.add(
        Paragraph(
            f"From {_moment(first.start)} to {_moment(first.end)} UTC ({_span(first.end - first.start)}), "
            f"replayed from {_SOURCES.get(first.source, first.source)}. The actions were rehearsed in a "
            "scratch state database: nothing outside it changed."
        )
    )
    if missing is not None:
        out.add(Paragraph(f"Charts are not included: {missing}.", note=True))
    out.add(Heading(2, "Side by side" if len(runs) > 1 else "Totals"), _totals(runs))
    for number, (label, run) in enumerate(runs):
        _run(out, number, label, run, len(runs) > 1, draw=missing is None)
    body = "\n".join(to_html.block_element(block, out.images, out.alts) for block in out.blocks)
    return to_html.document(title, body)


def _totals(runs: Sequence[tuple[str, Backtest]]) -> Table:
    """Every run's figures in a column of its own (``render.totals``)."""
    figures = [totals(run) for _, run in runs]
    rows = [
        [Cell(name), *(Cell(str(f[key])) for f in figures)]
        for name, key in (
            ("rules replayed", "rules"),
            ("rules not replayed", "skipped"),
            ("firings", "firings"),
            ("minutes firing", "minutes_firing"),
            ("incidents", "incidents"),
            ("incidents caught", "caught"),
            ("incidents missed", "missed"),
            ("false alarms", "false_alarms"),
        )
    ]
    rows.append([Cell("median to firing"), *(Cell(_span(f["median_to_firing"])) for f in figures)])
    rows.append([Cell("median to action"), *(Cell(_span(f["median_to_action"])) for f in figures)])
    rows.append(
        [
            Cell("firings recorded live, reproduced"),
            *(Cell(f"{f['reproduced']} of {f['recorded']}") for f in figures),
        ]
    )
    for action in sorted({a for f in figures for a in f["actions"]}):
        rows.append([Cell(f"{action} runs"), *(Cell(_counts(f["actions"].get(action, {}))) for f in figures)])
    return Table(("", *(label or "the rules" for label, _ in runs)), rows)


def _moment(at: float | None) -> str:
    """A time as the text shows it (UTC), or the report's dash for none."""
    return MISSING if at is None else render.moment(at)


def _span(seconds: float | None) -> str:
    return MISSING if seconds is None else render.span(seconds)


def _counts(by: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(by.items())) or MISSING


def _run(out: _Page, number: int, label: str, run: Backtest, several: bool, draw: bool) -> None:
    out.add(Heading(2, f"Rules file {label}" if several else "Rules"))
    for note in run.notes:
        out.add(Paragraph(note, note=True))
    if run.silences:
        out.add(Paragraph(f"{run.silences} silence(s) recorded live over the period were applied."))
    out.add(_overview(run))
    changes = [(at, name, what) for name, flags in run.flags.items() for at, what in flags]
    if changes:
        out.add(Heading(3, "Fallback flags"))
        rows = [[Cell(_moment(at)), Cell(name), Cell(what)] for at, name, what in sorted(changes)]
        out.add(Table(("when (UTC)", "flag", "change"), rows, align="lll"))
    for index, result in enumerate(run.rules):
        _rule(out, f"{number}-{index}", result, run, draw)


def _overview(run: Backtest) -> Table:
    rows = []
    for r in run.rules:
        if r.plan.skip is not None:
            rows.append([Cell(r.name), Cell("not replayed"), *(Cell(MISSING) for _ in range(5))])
            continue
        s = r.score
        rows.append([
            Cell(r.name),
            Cell(_every(r)),
            Cell(str(len(r.judged.traces))),
            Cell(str(len(r.episodes))),
            Cell(f"{sum(duration(e, run.end) for e in r.episodes) / 60:.1f}"),
            Cell(f"{s.caught} of {s.incidents}" if s is not None else MISSING),
            Cell(str(len(s.false_alarms)) if s is not None else MISSING),
        ])  # fmt: skip
    headers = ("rule", "every", "series", "firings", "minutes firing", "incidents caught", "false alarms")
    return Table(headers, rows)


def _every(r: RuleResult) -> str:
    live = f" ({_span(r.plan.live_every)} live)" if r.plan.every != r.plan.live_every else ""
    return _span(r.plan.every) + live


def _labels(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "the one series"


def _rule(out: _Page, key: str, r: RuleResult, run: Backtest, draw: bool) -> None:
    rule = r.plan.item.rule
    out.add(Heading(3, r.name))
    if rule.description:
        out.add(Paragraph(rule.description))
    if r.plan.skip is not None:
        out.add(Paragraph(f"Not replayed: {r.plan.skip}.", note=True))
        return
    out.add(
        Paragraph(
            f"{_judges(r)}; evaluated every {_every(r)}: {r.judged.evaluations} evaluations "
            f"of {len(r.judged.traces)} series."
        )
    )
    if r.plan.notes:
        out.add(Paragraph("What the replay cannot match of the daemon:"), Items(list(r.plan.notes)))
    if r.judged.errors:
        out.add(Items([f"error in {n} evaluations: {error}" for error, n in r.judged.errors.items()]))
    if r.calibration is not None:
        out.add(Paragraph(f"Calibration: {r.calibration['said']}"))
    _firings(out, r, run.end)
    _actions(out, r)
    _reproduced(out, r)
    _score(out, r)
    _series(out, key, r, run, draw)


def _judges(r: RuleResult) -> str:
    rule = r.plan.item.rule
    read = rule.signal or f"PromQL {rule.expr}"
    if rule.detect is not None:
        return f"{read}: {rule.detect.describe()}"
    return f"{read} {rule.condition.text if rule.condition is not None else ''}".rstrip()


def _firings(out: _Page, r: RuleResult, end: float) -> None:
    if not r.episodes:
        out.add(Paragraph("No firing."))
        return
    out.add(Heading(4, "Firings"))
    rows = [
        [
            Cell(_labels(e.labels)),
            Cell(_moment(e.pending)),
            Cell(_moment(e.fired)),
            Cell(_moment(e.resolved) if e.resolved is not None else "still firing at the end"),
            Cell(_span(duration(e, end))),
            Cell(_span(e.first_action - e.fired) if e.first_action is not None else MISSING),
        ]
        for e in r.episodes
    ]
    headers = ("series", "pending (UTC)", "firing (UTC)", "resolved (UTC)", "for", "first action after")
    out.add(Table(headers, rows, align="lllllr", compact=True))


def _actions(out: _Page, r: RuleResult) -> None:
    if not r.actions:
        return
    out.add(Heading(4, "Actions"))
    rows = [
        [
            Cell(_moment(a["at"])),
            Cell(str(a["event"])),
            Cell(_labels(a.get("labels") or {})),
            Cell(f"{a['action']} ({a['mode']})"),
            Cell(str(a["status"])),
            Cell(str(a.get("reason") or a.get("detail") or "")),
        ]
        for a in r.actions[:MOST_ROWS]
    ]
    out.add(
        Table(
            ("when (UTC)", "event", "series", "action", "status", "why"), rows, align="llllll", compact=True
        )
    )
    if len(r.actions) > MOST_ROWS:
        out.add(
            Paragraph(f"{len(r.actions) - MOST_ROWS} more action runs are left out here: --json lists them.")
        )


def _reproduced(out: _Page, r: RuleResult) -> None:
    if not r.reproduced:
        return
    out.add(Heading(4, "Firings recorded live"))
    rows = []
    for x in r.reproduced:
        if x["replayed"] is None:
            replayed, difference = "not reproduced", MISSING
        else:
            sign = "+" if x["difference"] >= 0 else "-"
            replayed = _moment(x["replayed"])
            difference = (
                sign + _span(abs(x["difference"])) + ("" if x["within"] else ", outside the resolution")
            )
        rows.append(
            [Cell(_labels(x["labels"])), Cell(_moment(x["recorded"])), Cell(replayed), Cell(difference)]
        )
    out.add(
        Table(("series", "recorded (UTC)", "replayed (UTC)", "difference"), rows, align="llll", compact=True)
    )


def _score(out: _Page, r: RuleResult) -> None:
    s = r.score
    if s is None:
        return
    out.add(Paragraph(f"Incidents caught: {s.caught} of {s.incidents}; false alarms: {len(s.false_alarms)}."))
    said = [
        f"missed incident {_moment(i.start)} to {_moment(i.end)} UTC ({_labels(i.match) if i.match else 'every series'})"
        + (f": {i.note}" if i.note else "")
        for i in s.missed
    ]
    said += [f"false alarm {_moment(e.fired)} UTC ({_labels(e.labels)})" for e in s.false_alarms]
    if said:
        out.add(Items(said))


def _series(out: _Page, key: str, r: RuleResult, run: Backtest, draw: bool) -> None:
    """The rule's series: a row each, and a timeline of those that were firing or pending longest."""
    traces = sorted(r.judged.traces.values(), key=lambda t: _labels(t.labels))
    if not traces:
        return
    out.add(Heading(4, "Series"))
    every = r.plan.every
    rows = [
        [
            Cell(_labels(t.labels)),
            Cell(str(len(t.at))),
            Cell(str(sum(1 for v in t.value if math.isnan(v)))),
            Cell(_range(t.value)),
            Cell(_range(t.threshold)),
            Cell(_span(t.state.count(_PENDING) * every)),
            Cell(_span(t.state.count(_FIRING) * every)),
        ]
        for t in traces
    ]
    headers = ("series", "evaluations", "without a value", "value", "threshold", "pending", "firing")
    out.add(Table(headers, rows, compact=True))
    if not draw:
        return
    drawn = sorted(traces, key=lambda t: (-t.state.count(_FIRING), -t.state.count(_PENDING)))[:MOST_CHARTS]
    ylabel = (
        "CUSUM statistic" if r.plan.item.rule.detect is not None else (r.plan.item.rule.signal or "value")
    )
    chosen = {id(t) for t in drawn}
    for number, trace in enumerate(t for t in traces if id(t) in chosen):
        chart = _timeline(trace, f"{r.name}: {_labels(trace.labels)}", ylabel, (run.start, run.end))
        if chart is None:
            continue
        name = f"timeline-{key}-{number}"
        out.images[name], out.alts[name] = chart
        out.add(Image(name, _labels(trace.labels)))
    if len(traces) > len(drawn):
        out.add(
            Paragraph(
                f"Timelines of {len(traces) - len(drawn)} more series are left out: the {len(drawn)} firing "
                "or pending longest are drawn."
            )
        )


def _timeline(trace: Trace, title: str, ylabel: str, period: tuple[float, float]) -> tuple[bytes, str] | None:
    states = [STATES[code].value for code in trace.state]
    return charts.timeline(trace.at, trace.value, trace.threshold, states, title, ylabel, period)


def _range(values: Sequence[float]) -> str:
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return MISSING
    low, high = min(known), max(known)
    return f"{low:.4g}" if low == high else f"{low:.4g} to {high:.4g}"
