"""The weekly report as people read it: Markdown (with its charts as PNG files beside it) or one
self-contained HTML file (charts inlined), from the report's JSON document (report/model.py).

Both renderings are made from one outline of the report, so they hold the same sections in the
same order. Labels, rule names and reasoning come from vLLM's metrics and from configuration, not
from specguard, so every piece of text is escaped for the format it lands in: a model named
``<script>`` must show as text in a browser and in a Markdown viewer alike. The HTML file loads
nothing and runs nothing (its Content-Security-Policy forbids both), so it can be mailed, attached
to a ticket or opened from a shared drive safely.
"""

from __future__ import annotations

import base64
import html as html_escape
import json
import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specguard.common.files import write_atomically
from specguard.report import charts
from specguard.report.model import HEADLINE, Report

FORMATS: tuple[str, ...] = ("md", "html", "json")

# What a missing value (null: no data) shows as; "None" or "nan" would read as a value.
MISSING = "\u2013"  # an en dash
_TIMES = "\u00d7"  # the multiplication sign of "2.19x faster"

_LABELS: dict[str, str] = {
    "acceptance_rate": "Acceptance rate",
    "mean_acceptance_length": "Mean acceptance length",
    "estimated_speedup": "Estimated speedup",
    "ttft_p50": "TTFT p50",
    "ttft_p95": "TTFT p95",
    "itl_p50": "Inter-token latency p50",
    "itl_p95": "Inter-token latency p95",
    "e2e_latency_p50": "End-to-end latency p50",
    "e2e_latency_p95": "End-to-end latency p95",
    "generation_throughput": "Generation throughput",
    "request_rate": "Request rate",
    "kv_cache_usage_mean": "KV-cache usage, mean",
    "kv_cache_usage_max": "KV-cache usage, max",
    "preemptions": "Preemptions",
    "drafts": "Drafts",
    "firings": "Rules fired on it",
}

_UNITS: dict[str, str] = {
    "acceptance_rate": "ratio",
    "mean_acceptance_length": "tokens",
    "estimated_speedup": "times",
    "ttft_p50": "seconds",
    "ttft_p95": "seconds",
    "itl_p50": "seconds",
    "itl_p95": "seconds",
    "e2e_latency_p50": "seconds",
    "e2e_latency_p95": "seconds",
    "generation_throughput": "tokens/s",
    "request_rate": "requests/s",
    "kv_cache_usage_mean": "ratio",
    "kv_cache_usage_max": "ratio",
    "preemptions": "count",
    "drafts": "count",
    "firings": "count",
}

# Which way is better, for colouring a change: 1 up, -1 down, 0 neither (more traffic is not
# better or worse; KV-cache usage is fine until it is not).
_BETTER: dict[str, int] = {
    "acceptance_rate": 1,
    "mean_acceptance_length": 1,
    "estimated_speedup": 1,
    "ttft_p50": -1,
    "ttft_p95": -1,
    "itl_p50": -1,
    "itl_p95": -1,
    "e2e_latency_p50": -1,
    "e2e_latency_p95": -1,
    "generation_throughput": 1,
    "preemptions": -1,
    "firings": -1,
}


# The outline both renderings are made from. Text in it is plain text: each format escapes it.


@dataclass(frozen=True)
class _Cell:
    text: str
    change: str = ""  # a week-over-week change shown after the value
    tone: str = ""  # "good" or "bad": the HTML colours the change


@dataclass(frozen=True)
class _Heading:
    level: int
    text: str


@dataclass(frozen=True)
class _Paragraph:
    text: str
    note: bool = False  # something the reader must not miss (charts left out)


@dataclass(frozen=True)
class _Table:
    headers: tuple[str, ...]
    rows: list[list[_Cell]]
    align: str = ""  # a letter per column, "l" or "r"; default: the first left, the rest right
    compact: bool = False

    def alignment(self) -> str:
        return self.align or "l" + "r" * (len(self.headers) - 1)


@dataclass(frozen=True)
class _Items:
    items: list[str]


@dataclass(frozen=True)
class _Image:
    name: str
    title: str


_Block = _Heading | _Paragraph | _Table | _Items | _Image


@dataclass
class _Outline:
    title: str
    blocks: list[_Block] = field(default_factory=list)


# Public API


def markdown(report: Report, images: Mapping[str, str], alts: Mapping[str, str] | None = None) -> str:
    """The report in Markdown. ``images`` maps a chart's name (see report/charts.py) to the file,
    relative to the Markdown file, that holds its PNG; ``alts`` optionally gives each chart a
    description of what it shows (else its title)."""
    outline = _outline(report, set(images))
    lines = [f"# {_md(outline.title)}", ""]
    for block in outline.blocks:
        lines.extend(_md_block(block, images, alts or {}))
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def html(report: Report, images: Mapping[str, bytes], alts: Mapping[str, str] | None = None) -> str:
    """The report as one HTML file: ``images`` maps a chart's name to its PNG, inlined as a data:
    URI; the style is inline; nothing is loaded from elsewhere and there is no script."""
    outline = _outline(report, set(images))
    body = "\n".join(_html_block(block, images, alts or {}) for block in outline.blocks)
    title = _h(outline.title)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
        f"<h1>{title}</h1>\n{body}\n</main>\n</body>\n</html>\n"
    )


def write(report: Report, fmt: str, out_dir: Path, drawn: list[charts.Chart] | None = None) -> list[Path]:
    """Write the report as ``out_dir/report-<from>-<to>.<fmt>`` (``md``, ``html`` or ``json``) and
    return the paths written, the report first. Markdown gets its charts beside it as
    ``report-<from>-<to>-<chart>.png``, written before the Markdown so that a reader of the new
    file finds its images. Every file is replaced atomically: a reader sees the old report or the
    new one. ``drawn``: the charts, when the caller drew them already (several formats, one
    drawing). Raises ValueError for an unknown format or a report without a period, OSError."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")
    stem = filename_stem(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.{fmt}"
    if fmt == "json":
        write_atomically(path, json.dumps(report, indent=2) + "\n", keep_previous=False)
        return [path]
    if drawn is None:
        drawn = charts.charts(report) if charts.available() is None else []
    alts = {chart.name: chart.alt for chart in drawn}
    if fmt == "html":
        write_atomically(path, html(report, {c.name: c.png for c in drawn}, alts), keep_previous=False)
        return [path]
    pngs = write_charts(report, drawn, out_dir)
    names = {chart.name: png.name for chart, png in zip(drawn, pngs, strict=True)}
    write_atomically(path, markdown(report, names, alts), keep_previous=False)
    return [path, *pngs]


def write_charts(report: Report, drawn: list[charts.Chart], out_dir: Path) -> list[Path]:
    """Each chart as ``report-<from>-<to>-<chart>.png`` in ``out_dir``, atomically."""
    stem = filename_stem(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: list[Path] = []
    for chart in drawn:
        png = out_dir / f"{stem}-{chart.name}.png"
        _write_bytes_atomically(png, chart.png)
        pngs.append(png)
    return pngs


def filename_stem(report: Report) -> str:
    """``report-<from>-<to>``, the UTC dates (YYYY-MM-DD) of the report's period, with the time
    (THHMM) when a bound is not a midnight: two reports of one day do not overwrite each other."""
    period = report.get("period") or {}
    times = []
    for end in ("from", "to"):
        at = _time(period.get(end))
        if at is None:
            raise ValueError(f"the report's period has no valid {end!r} time: {period.get(end)!r}")
        times.append(at)
    midnights = all((t.hour, t.minute, t.second) == (0, 0, 0) for t in times)
    shown = [t.strftime("%Y-%m-%d" if midnights else "%Y-%m-%dT%H%M") for t in times]
    return f"report-{shown[0]}-{shown[1]}"


# The outline


def _outline(report: Report, images: set[str]) -> _Outline:
    period = report.get("period") or {}
    previous = report.get("previous_period") or {}
    host = _text(report.get("host"))
    outline = _Outline(
        f"specguard report for {host}: {_when(period.get('from'))} to {_when(period.get('to'))}"
    )
    add = outline.blocks.append
    add(
        _Paragraph(
            f"Generated {_when(report.get('generated_at'))}. Changes are against the period "
            f"{_when(previous.get('from'))} to {_when(previous.get('to'))}."
        )
    )
    note = _charts_note(report, images)
    if note is not None:
        add(_Paragraph(note, note=True))

    all_series = [s for s in report.get("series") or [] if isinstance(s, dict)]
    add(_Heading(2, "Summary"))
    if all_series:
        add(_summary(all_series))
    else:
        add(_Paragraph("No series had speculative decoding data in this period."))

    add(_Heading(2, "Recommendations"))
    recommendations = [r for r in report.get("recommendations") or [] if isinstance(r, dict)]
    if not recommendations:
        add(_Paragraph("No recommendations for this period."))
    for recommendation in recommendations:
        add(_Heading(3, _text(recommendation.get("title"))))
        where = f"{_text(recommendation.get('model'))} on {_text(recommendation.get('instance'))}"
        add(_Paragraph(f"{where} ({_text(recommendation.get('kind'))})"))
        reasoning = [_text(line) for line in recommendation.get("reasoning") or []]
        if reasoning:
            add(_Items(reasoning))

    for series, slug in zip(report.get("series") or [], charts.slugs(report), strict=True):
        if isinstance(series, dict):
            outline.blocks.extend(_series(series, slug, images))

    outline.blocks.extend(_rules(report))
    outline.blocks.extend(_fallbacks(report))
    outline.blocks.extend(_restarts(report))
    outline.blocks.extend(_silences(report))
    return outline


def _charts_note(report: Report, images: set[str]) -> str | None:
    """One line saying why the charts are missing, when they are."""
    if images:
        return None
    entry = report.get("charts")
    if isinstance(entry, dict) and entry.get("available") is False:
        missing = entry.get("missing")
        return f"Charts are not included: {_text(missing) if missing else charts.INSTALL}."
    unavailable = charts.available()
    if unavailable is not None:
        return f"Charts are not included: {unavailable}."
    return None


def _summary(all_series: list[dict[str, Any]]) -> _Table:
    rows = []
    for series in all_series:
        headline = series.get("headline") or {}
        row = [_Cell(charts.label(series))]
        for name in ("acceptance_rate", "mean_acceptance_length", "estimated_speedup"):
            figure = headline.get(name) or {}
            text = _value(name, figure.get("value"))
            change, tone = _change(figure.get("change"), _BETTER.get(name, 0))
            row.append(_Cell(text, "" if text == MISSING else change, tone))
        e2e = headline.get("e2e_latency_p95") or {}
        latency = _latency_row(series, "e2e_latency_p95")
        value = e2e.get("value", latency.get("value"))
        baseline = _number(latency.get("baseline"))
        text = _value("e2e_latency_p95", value)
        if baseline is None:
            text += ", no baseline" if _number(value) is not None else ""
        else:
            text += f" vs {_seconds(baseline)} ({_ratio(_latency_ratio(latency))})"
        change, tone = _change(e2e.get("change"), -1)
        row.append(_Cell(text, "" if text == MISSING else change, tone))
        rows.append(row)
    headers = (
        "Series",
        "Acceptance rate",
        "Mean acceptance length",
        "Estimated speedup",
        "e2e p95 vs baseline",
    )
    return _Table(headers, rows)


def _series(series: dict[str, Any], slug: str, images: set[str]) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, charts.label(series))]
    cost = _number(series.get("draft_cost"))
    source = series.get("draft_cost_source")
    shares = series.get("k_share")
    mixed = ""
    if isinstance(shares, dict) and shares:
        told = [
            f"k = {_text(k)} for {share * 100:.0f} %"
            for k, share in shares.items()
            if isinstance(share, float | int)
        ]
        mixed = (
            f" (k changed in the period: {', '.join(told)} of the drafts; position i's rate is over the "
            "drafts that had a position i)"
        )
    blocks.append(
        _Paragraph(
            f"k = {_count(series.get('k'))} draft positions counted at the period's end{mixed}; draft cost "
            f"per step c = {MISSING if cost is None else f'{cost:g}'}"
            + (f" ({_text(source)})" if source else "")
            + "."
        )
    )

    headline = series.get("headline") or {}
    rows = []
    names = list(HEADLINE) + [n for n in headline if n not in HEADLINE]
    for name in names:
        figure = headline.get(name) or {}
        change, tone = _change(figure.get("change"), _BETTER.get(name, 0))
        rows.append(
            [
                _Cell(_LABELS.get(name, str(name))),
                _Cell(_value(name, figure.get("value"))),
                _Cell(_value(name, figure.get("previous"))),
                _Cell("", change or MISSING, tone),
            ]
        )
    blocks += [
        _Heading(3, "This period against the one before"),
        _Table(("", "This period", "The one before", "Change"), rows),
    ]

    blocks.append(_Heading(3, "By day"))
    days = [row for row in series.get("by_day") or [] if isinstance(row, dict)]
    if days:
        rows = [[_Cell(_day(row.get("day"))), *_acceptance_cells(row)] for row in days]
        blocks.append(
            _Table(
                ("Day (UTC)", "Acceptance rate", "Mean acceptance length", "Estimated speedup", "Drafts"),
                rows,
            )
        )
    else:
        blocks.append(_Paragraph("No data."))

    blocks.append(_Heading(3, "By hour of day (UTC)"))
    hours = [row for row in series.get("by_hour_of_day") or [] if isinstance(row, dict)]
    if hours:
        header = ("Hour", *(_hour(row.get("hour")) for row in hours))
        rates = [_number(row.get("acceptance_rate")) for row in hours]
        lengths = [_number(row.get("mean_acceptance_length")) for row in hours]
        rows = [
            [_Cell("Acceptance %"), *(_Cell(_fixed(None if r is None else r * 100, 0)) for r in rates)],
            [_Cell("Mean acc. length"), *(_Cell(_fixed(length, 1)) for length in lengths)],
        ]
        blocks.append(_Table(header, rows, compact=True))
    else:
        blocks.append(_Paragraph("No data."))

    blocks.append(_Heading(3, "Acceptance by draft position"))
    positions = [_number(p) for p in series.get("per_position") or []]
    if positions:
        rows = []
        for i, share in enumerate(positions):
            before = 1.0 if i == 0 else positions[i - 1]
            given = None if share is None or not before else share / before
            rows.append([_Cell(str(i + 1)), _Cell(_percent(share)), _Cell(_percent(given))])
        headers = ("Position", "Drafts accepted up to it", "Accepted when the one before was")
        blocks.append(_Table(headers, rows))
    else:
        blocks.append(_Paragraph("No data."))

    blocks.append(_Heading(3, "Latency against the baseline"))
    latency = [row for row in series.get("latency") or [] if isinstance(row, dict)]
    if latency:
        rows = []
        for row in latency:
            signal = _text(row.get("signal"))
            rows.append(
                [
                    _Cell(_LABELS.get(signal, signal)),
                    _Cell(_value("seconds", row.get("value"))),
                    _Cell(_value("seconds", row.get("baseline"))),
                    _Cell(_ratio(_latency_ratio(row))),
                ]
            )
        blocks.append(_Table(("Signal", "This period", "Baseline", "Ratio"), rows))
    else:
        blocks.append(_Paragraph("No data."))

    shown = [kind for kind in charts.KINDS if charts.name(kind, slug) in images]
    if shown:
        blocks.append(_Heading(3, "Charts"))
        blocks += [_Image(charts.name(kind, slug), charts.title(kind, series)) for kind in shown]
    return blocks


def _acceptance_cells(row: dict[str, Any]) -> list[_Cell]:
    return [
        _Cell(_value("acceptance_rate", row.get("acceptance_rate"))),
        _Cell(_value("mean_acceptance_length", row.get("mean_acceptance_length"))),
        _Cell(_value("estimated_speedup", row.get("estimated_speedup"))),
        _Cell(_value("drafts", row.get("drafts"))),
    ]


def _rules(report: Report) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, "Rules fired")]
    rules = [r for r in report.get("rules") or [] if isinstance(r, dict)]
    if not rules:
        return [*blocks, _Paragraph("No rule fired in this period.")]
    rows = [
        [
            _Cell(_text(rule.get("rule"))),
            _Cell(_text(rule.get("severity"))),
            _Cell(_count(rule.get("fired"))),
            _Cell(_count(rule.get("fired_previous"))),
            _Cell(_count(rule.get("resolved"))),
            _Cell(_duration(rule.get("median_time_to_act"))),
        ]
        for rule in rules
    ]
    blocks.append(
        _Table(
            ("Rule", "Severity", "Fired", "Period before", "Resolved", "Median time to act"),
            rows,
            align="llrrrr",
        )
    )
    firings = [
        (rule, firing) for rule in rules for firing in rule.get("firings") or [] if isinstance(firing, dict)
    ]
    if firings:
        firings.sort(key=lambda pair: str(pair[1].get("at") or ""))
        rows = [
            [
                _Cell(_when(firing.get("at"))),
                _Cell(_text(rule.get("rule"))),
                _Cell(_text(firing.get("series"))),
                _Cell(_general(firing.get("value"))),
                _Cell(_when(firing.get("since"))),
                _Cell(_when(firing.get("resolved_at"))),
                _Cell(_duration(firing.get("time_to_act"))),
                _Cell(_text(firing.get("acted_by")) if firing.get("acted_by") else MISSING),
            ]
            for rule, firing in firings
        ]
        headers = ("Fired", "Rule", "Series", "Value", "Breach since", "Resolved", "Time to act", "By")
        blocks += [_Heading(3, "Firings"), _Table(headers, rows, align="lllrllrl")]
        said = [_said(rule, firing) for rule, firing in firings if firing.get("message")]
        if said:
            blocks += [_Heading(3, "What the firings and their resolutions said"), _Items(said)]
    return blocks


def _said(rule: dict[str, Any], firing: dict[str, Any]) -> str:
    """A firing's message and its resolution's, each worded by the rule for its transition."""
    text = f"{_when(firing.get('at'))} {_text(rule.get('rule'))}: {_text(firing.get('message'))}"
    if firing.get("resolved_message"):
        text += f"; resolved {_when(firing.get('resolved_at'))}: {_text(firing.get('resolved_message'))}"
    return text


def _fallbacks(report: Report) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, "Fallbacks")]
    fallbacks = report.get("fallbacks") or {}
    count = _number(fallbacks.get("count"))
    seconds = _number(fallbacks.get("seconds"))
    spans = [s for s in fallbacks.get("spans") or [] if isinstance(s, dict)]
    if not count and not spans:
        previous = fallbacks.get("previous") if isinstance(fallbacks.get("previous"), dict) else {}
        before = (
            f" The period before: {_count(previous.get('count'))}."
            if previous and _number(previous.get("count"))
            else ""
        )
        return [*blocks, _Paragraph(f"No fallback to standard decoding in this period.{before}")]
    total = _duration(seconds) + (f" ({seconds:.0f} s)" if seconds is not None and seconds >= 60 else "")
    plural = "" if count == 1 else "s"
    previous = fallbacks.get("previous") if isinstance(fallbacks.get("previous"), dict) else {}
    before = ""
    if previous:
        then = _number(previous.get("seconds"))
        before = f" The period before: {_count(previous.get('count'))}, {_duration(then)} in fallback."
    blocks.append(
        _Paragraph(
            f"{_count(count)} fallback{plural} to standard decoding, {total} in fallback in total.{before}"
        )
    )
    if spans:
        rows = [
            [
                _Cell(_text(span.get("action"))),
                _Cell(_when(span.get("engaged"))),
                _Cell(_when(span.get("restored")) if span.get("restored") else "not restored"),
                _Cell(_duration(span.get("seconds"))),
            ]
            for span in spans
        ]
        blocks.append(_Table(("Action", "Engaged", "Restored", "In fallback"), rows, align="lllr"))
    return blocks


def _restarts(report: Report) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, "Restarts and rung changes")]
    restarts = [r for r in report.get("restarts") or [] if isinstance(r, dict)]
    if not restarts:
        return [*blocks, _Paragraph("No restart in this period.")]
    rows = []
    for restart in restarts:
        k_from, k_to = restart.get("k_from"), restart.get("k_to")
        rung = MISSING if k_from is None and k_to is None else f"{_count(k_from)} → {_count(k_to)}"
        rows.append(
            [
                _Cell(_when(restart.get("at"))),
                _Cell(_text(restart.get("action"))),
                _Cell(_text(restart.get("status"))),
                _Cell(rung),
                _Cell(_text(restart.get("detail"))),
            ]
        )
    blocks.append(_Table(("At", "Action", "Status", "num_speculative_tokens", "Detail"), rows, align="lllll"))
    return blocks


def _silences(report: Report) -> list[_Block]:
    blocks: list[_Block] = [_Heading(2, "Silences")]
    silences = [s for s in report.get("silences") or [] if isinstance(s, dict)]
    if not silences:
        return [*blocks, _Paragraph("No silence in this period.")]
    rows = [
        [
            _Cell(_text(silence.get("rule"))),
            _Cell(_when(silence.get("starts"))),
            _Cell(_when(silence.get("ends"))),
            _Cell(_text(silence.get("reason"))),
            _Cell(_text(silence.get("author"))),
        ]
        for silence in silences
    ]
    blocks.append(_Table(("Rule", "From", "Until", "Reason", "Author"), rows, align="lllll"))
    return blocks


# Values


def _number(value: Any) -> float | None:
    """A number from the document, or None for null (and for anything that is not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return MISSING if value is None or value == "" else str(value)


def _value(name: str, value: Any) -> str:
    """A headline figure in its unit: seconds as ms below a second, ratios as percentages."""
    number = _number(value)
    if number is None:
        return MISSING
    unit = _UNITS.get(name, name)  # a name or a unit
    if unit == "ratio":
        return _percent(number)
    if unit == "seconds":
        return _seconds(number)
    if unit == "tokens":
        return f"{number:.2f}"
    if unit == "times":
        return f"{number:.2f}{_TIMES}"
    if unit == "tokens/s":
        return f"{number:,.0f} tok/s"
    if unit == "requests/s":
        return f"{number:.2f} req/s"
    if unit == "count":
        return f"{number:,.0f}"
    return _general(number)


def _percent(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{ratio * 100:.1f} %"


def _seconds(seconds: float) -> str:
    if abs(seconds) >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * 1000
    return f"{ms:.1f} ms" if abs(ms) < 10 else f"{ms:.0f} ms"


def _fixed(value: float | None, digits: int) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def _general(value: Any) -> str:
    number = _number(value)
    return MISSING if number is None else f"{number:.4g}"


def _count(value: Any) -> str:
    number = _number(value)
    return MISSING if number is None else f"{number:,.0f}"


def _change(change: Any, better: int) -> tuple[str, str]:
    """The week-over-week change as an arrow and a signed percentage, and whether it is good news."""
    number = _number(change)
    if number is None:
        return MISSING, ""
    if abs(number) < 0.0005:
        return "→ 0.0 %", ""
    arrow = "▲" if number > 0 else "▼"
    tone = "" if not better else ("good" if (number > 0) == (better > 0) else "bad")
    return f"{arrow} {number * 100:+.1f} %", tone


def _latency_row(series: dict[str, Any], signal: str) -> dict[str, Any]:
    for row in series.get("latency") or []:
        if isinstance(row, dict) and row.get("signal") == signal:
            return row
    return {}


def _latency_ratio(row: dict[str, Any]) -> float | None:
    ratio = _number(row.get("ratio"))
    if ratio is not None:
        return ratio
    value, baseline = _number(row.get("value")), _number(row.get("baseline"))
    return None if value is None or not baseline else value / baseline


def _ratio(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{_TIMES}{ratio:.2f}"


def _duration(value: Any) -> str:
    """Seconds for people: 1.2 s, 41 s, 3 min 20 s, 1 h 30 min, 2 d 3 h."""
    seconds = _number(value)
    if seconds is None:
        return MISSING
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    if whole < 86400:
        hours, rest = divmod(whole, 3600)
        return f"{hours} h" + (f" {rest // 60} min" if rest // 60 else "")
    days, rest = divmod(whole, 86400)
    return f"{days} d" + (f" {rest // 3600} h" if rest // 3600 else "")


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)


def _when(value: Any) -> str:
    """An ISO 8601 time as ``2026-12-02 14:09 UTC``; text that is not one is shown as it is."""
    at = _time(value)
    if at is None:
        return _text(value)
    return at.strftime("%Y-%m-%d %H:%M UTC")


def _hour(value: Any) -> str:
    number = _number(value)
    return MISSING if number is None else f"{number:02.0f}"


def _day(value: Any) -> str:
    try:
        return datetime.fromisoformat(str(value)).strftime("%a %Y-%m-%d")
    except ValueError:
        return _text(value)


# Markdown

# Characters that would start Markdown syntax (or raw HTML) inside a line. "_" is handled apart:
# inside a word (p_i, acceptance_fallback) it starts nothing, and escaping it there would litter
# the source people read.
_MD_SPECIAL = re.compile(r"([\\`*\[\]|<>~])")
_MD_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_MD_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
_MD_LINE_START = re.compile(r"^(#{1,6}|[+=-]|\d{1,9}[.)])(?=\s|$)")


def _md(text: str) -> str:
    """Plain text as Markdown that shows exactly that text, on one line (tables and list items)."""
    text = " ".join(text.split())
    text = _MD_ENTITY.sub("&amp;", text)
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = _MD_UNDERSCORE.sub(r"\\_", text)
    return _MD_LINE_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], text)


def _md_cell(cell: _Cell) -> str:
    return _md(" ".join(part for part in (cell.text, cell.change) if part)) or " "


def _md_block(block: _Block, images: Mapping[str, str], alts: Mapping[str, str]) -> list[str]:
    if isinstance(block, _Heading):
        return ["#" * block.level + " " + _md(block.text)]
    if isinstance(block, _Paragraph):
        return [f"> **{_md(block.text)}**" if block.note else _md(block.text)]
    if isinstance(block, _Items):
        return [f"- {_md(item)}" for item in block.items]
    if isinstance(block, _Image):
        target = images[block.name]
        if re.search(r"[\s()<>]", target):
            target = "<" + target.replace("<", "%3C").replace(">", "%3E") + ">"
        return [f"![{_md(alts.get(block.name, block.title))}]({target})", "", f"*{_md(block.title)}*"]
    rule = {"l": ":--", "r": "--:"}
    lines = [
        "| " + " | ".join(_md(h) or " " for h in block.headers) + " |",
        "| " + " | ".join(rule[a] for a in block.alignment()) + " |",
    ]
    lines += ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in block.rows]
    return lines


# HTML

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1c2430;background:#fff;margin:0}
main{max-width:1100px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:1.55em;margin:0 0 .3em}
h2{font-size:1.25em;margin:1.8em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #d8dee6}
h3{font-size:1.05em;margin:1.3em 0 .4em}
table{border-collapse:collapse;margin:.4em 0 1em;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid #e4e8ee;vertical-align:top}
th{background:#f3f5f8;font-weight:600}
td.r,th.r{text-align:right;white-space:nowrap}
td.l,th.l{text-align:left}
table.compact{font-size:.8em}
table.compact th,table.compact td{padding:2px 4px}
.change{white-space:nowrap;color:#56606d;margin-left:.4em}
.good{color:#1a7f37}
.bad{color:#c0362c}
.note{background:#fff4d6;border-left:4px solid #d9a300;padding:8px 12px}
figure{margin:.6em 0 1.2em}
figure img{max-width:100%;height:auto;border:1px solid #e4e8ee}
figcaption{font-size:.85em;color:#56606d}
ul{margin:.3em 0 1em;padding-left:1.4em}
""".strip()


def _h(text: str) -> str:
    return html_escape.escape(text, quote=True)


def _html_cell(cell: _Cell, tag: str, align: str) -> str:
    inner = _h(cell.text)
    if cell.change:
        inner += f'<span class="change {cell.tone}">{_h(cell.change)}</span>'
    return f'<{tag} class="{align}">{inner}</{tag}>'


def _html_block(block: _Block, images: Mapping[str, bytes], alts: Mapping[str, str]) -> str:
    if isinstance(block, _Heading):
        return f"<h{block.level}>{_h(block.text)}</h{block.level}>"
    if isinstance(block, _Paragraph):
        return f'<p class="note">{_h(block.text)}</p>' if block.note else f"<p>{_h(block.text)}</p>"
    if isinstance(block, _Items):
        return "<ul>" + "".join(f"<li>{_h(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, _Image):
        data = base64.b64encode(images[block.name]).decode("ascii")
        alt = _h(alts.get(block.name, block.title))
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
            f"<figcaption>{_h(block.title)}</figcaption></figure>"
        )
    align = block.alignment()
    head = "".join(_html_cell(_Cell(h), "th", a) for h, a in zip(block.headers, align, strict=True))
    rows = "".join(
        "<tr>" + "".join(_html_cell(cell, "td", a) for cell, a in zip(row, align, strict=True)) + "</tr>"
        for row in block.rows
    )
    compact = ' class="compact"' if block.compact else ""
    return f"<table{compact}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


# Files


def _write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a part.

    common.files.write_atomically writes text; a PNG is bytes. The temporary file is created with
    mode 0666 so the umask, not a fixed 0600, decides who may read the image, as for the report.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
