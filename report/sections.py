"""What the report says, as an outline of blocks in the order both renderings show them: the
summary, the recommendations, each series' section, the traffic by class (with a router), the rules
that fired, fallbacks, restarts and silences."""

from __future__ import annotations

from typing import Any

from specguard.report import charts, values
from specguard.report.document import Block, Cell, Heading, Items, Outline, Paragraph, Table
from specguard.report.model import Report
from specguard.report.series_section import latency_ratio, latency_row, section
from specguard.report.traffic_section import traffic_section
from specguard.report.values import BETTER, MISSING


def outline_of(report: Report, images: set[str]) -> Outline:
    period = report.get("period") or {}
    previous = report.get("previous_period") or {}
    host = values.text(report.get("host"))
    outline = Outline(
        f"specguard report for {host}: {values.when(period.get('from'))} to {values.when(period.get('to'))}"
    )
    add = outline.blocks.append
    add(
        Paragraph(
            f"Generated {values.when(report.get('generated_at'))}. Changes are against the period "
            f"{values.when(previous.get('from'))} to {values.when(previous.get('to'))}."
        )
    )
    note = _charts_note(report, images)
    if note is not None:
        add(Paragraph(note, note=True))

    all_series = [s for s in report.get("series") or [] if isinstance(s, dict)]
    add(Heading(2, "Summary"))
    if all_series:
        add(_summary(all_series))
    else:
        add(Paragraph("No series had speculative decoding data in this period."))

    add(Heading(2, "Recommendations"))
    recommendations = [r for r in report.get("recommendations") or [] if isinstance(r, dict)]
    if not recommendations:
        add(Paragraph("No recommendations for this period."))
    for recommendation in recommendations:
        add(Heading(3, values.text(recommendation.get("title"))))
        where = f"{values.text(recommendation.get('model'))} on {values.text(recommendation.get('instance'))}"
        add(Paragraph(f"{where} ({values.text(recommendation.get('kind'))})"))
        reasoning = [values.text(line) for line in recommendation.get("reasoning") or []]
        if reasoning:
            add(Items(reasoning))

    for series, slug in zip(report.get("series") or [], charts.slugs(report), strict=True):
        if isinstance(series, dict):
            outline.blocks.extend(section(series, slug, images))

    outline.blocks.extend(traffic_section(report))
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
        return f"Charts are not included: {values.text(missing) if missing else charts.INSTALL}."
    unavailable = charts.available()
    if unavailable is not None:
        return f"Charts are not included: {unavailable}."
    return None


def _summary(all_series: list[dict[str, Any]]) -> Table:
    rows = []
    for series in all_series:
        headline = series.get("headline") or {}
        row = [Cell(charts.label(series))]
        for name in ("acceptance_rate", "mean_acceptance_length", "estimated_speedup"):
            figure = headline.get(name) or {}
            text = values.value(name, figure.get("value"))
            change, tone = values.change(figure.get("change"), BETTER.get(name, 0))
            row.append(Cell(text, "" if text == MISSING else change, tone))
        e2e = headline.get("e2e_latency_p95") or {}
        latency = latency_row(series, "e2e_latency_p95")
        value = e2e.get("value", latency.get("value"))
        baseline = values.as_number(latency.get("baseline"))
        text = values.value("e2e_latency_p95", value)
        if baseline is None:
            text += ", no baseline" if values.as_number(value) is not None else ""
        else:
            text += f" vs {values.seconds(baseline)} ({values.ratio(latency_ratio(latency))})"
        change, tone = values.change(e2e.get("change"), -1)
        row.append(Cell(text, "" if text == MISSING else change, tone))
        rows.append(row)
    headers = (
        "Series",
        "Acceptance rate",
        "Mean acceptance length",
        "Estimated speedup",
        "e2e p95 vs baseline",
    )
    return Table(headers, rows)


def _rules(report: Report) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Rules fired")]
    rules = [r for r in report.get("rules") or [] if isinstance(r, dict)]
    if not rules:
        return [*blocks, Paragraph("No rule fired in this period.")]
    rows = [
        [
            Cell(values.text(rule.get("rule"))),
            Cell(values.text(rule.get("severity"))),
            Cell(values.count(rule.get("fired"))),
            Cell(values.count(rule.get("fired_previous"))),
            Cell(values.count(rule.get("resolved"))),
            Cell(values.duration(rule.get("median_time_to_act"))),
        ]
        for rule in rules
    ]
    blocks.append(
        Table(
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
                Cell(values.when(firing.get("at"))),
                Cell(values.text(rule.get("rule"))),
                Cell(values.text(firing.get("series"))),
                Cell(values.general(firing.get("value"))),
                Cell(values.when(firing.get("since"))),
                Cell(values.when(firing.get("resolved_at"))),
                Cell(values.duration(firing.get("time_to_act"))),
                Cell(values.text(firing.get("acted_by")) if firing.get("acted_by") else MISSING),
            ]
            for rule, firing in firings
        ]
        headers = ("Fired", "Rule", "Series", "Value", "Breach since", "Resolved", "Time to act", "By")
        blocks += [Heading(3, "Firings"), Table(headers, rows, align="lllrllrl")]
        said = [_said(rule, firing) for rule, firing in firings if firing.get("message")]
        if said:
            blocks += [Heading(3, "What the firings and their resolutions said"), Items(said)]
    return blocks


def _said(rule: dict[str, Any], firing: dict[str, Any]) -> str:
    """A firing's message and its resolution's, each worded by the rule for its transition."""
    text = f"{values.when(firing.get('at'))} {values.text(rule.get('rule'))}: {values.text(firing.get('message'))}"
    if firing.get("resolved_message"):
        text += f"; resolved {values.when(firing.get('resolved_at'))}: {values.text(firing.get('resolved_message'))}"
    return text


def _fallbacks(report: Report) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Fallbacks")]
    fallbacks = report.get("fallbacks") or {}
    count = values.as_number(fallbacks.get("count"))
    seconds = values.as_number(fallbacks.get("seconds"))
    spans = [s for s in fallbacks.get("spans") or [] if isinstance(s, dict)]
    if not count and not spans:
        previous = fallbacks.get("previous") if isinstance(fallbacks.get("previous"), dict) else {}
        before = (
            f" The period before: {values.count(previous.get('count'))}."
            if previous and values.as_number(previous.get("count"))
            else ""
        )
        return [*blocks, Paragraph(f"No fallback to standard decoding in this period.{before}")]
    total = values.duration(seconds) + (
        f" ({seconds:.0f} s)" if seconds is not None and seconds >= 60 else ""
    )
    plural = "" if count == 1 else "s"
    previous = fallbacks.get("previous") if isinstance(fallbacks.get("previous"), dict) else {}
    before = ""
    if previous:
        then = values.as_number(previous.get("seconds"))
        before = (
            f" The period before: {values.count(previous.get('count'))}, {values.duration(then)} in fallback."
        )
    blocks.append(
        Paragraph(
            f"{values.count(count)} fallback{plural} to standard decoding, {total} in fallback in total.{before}"
        )
    )
    if spans:
        rows = [
            [
                Cell(values.text(span.get("action"))),
                Cell(values.when(span.get("engaged"))),
                Cell(values.when(span.get("restored")) if span.get("restored") else "not restored"),
                Cell(values.duration(span.get("seconds"))),
            ]
            for span in spans
        ]
        blocks.append(Table(("Action", "Engaged", "Restored", "In fallback"), rows, align="lllr"))
    return blocks


def _restarts(report: Report) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Restarts and rung changes")]
    restarts = [r for r in report.get("restarts") or [] if isinstance(r, dict)]
    if not restarts:
        return [*blocks, Paragraph("No restart in this period.")]
    rows = []
    for restart in restarts:
        k_from, k_to = restart.get("k_from"), restart.get("k_to")
        rung = (
            MISSING if k_from is None and k_to is None else f"{values.count(k_from)} → {values.count(k_to)}"
        )
        rows.append(
            [
                Cell(values.when(restart.get("at"))),
                Cell(values.text(restart.get("action"))),
                Cell(values.text(restart.get("status"))),
                Cell(rung),
                Cell(values.text(restart.get("detail"))),
            ]
        )
    blocks.append(Table(("At", "Action", "Status", "num_speculative_tokens", "Detail"), rows, align="lllll"))
    return blocks


def _silences(report: Report) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Silences")]
    silences = [s for s in report.get("silences") or [] if isinstance(s, dict)]
    if not silences:
        return [*blocks, Paragraph("No silence in this period.")]
    rows = [
        [
            Cell(values.text(silence.get("rule"))),
            Cell(values.when(silence.get("starts"))),
            Cell(values.when(silence.get("ends"))),
            Cell(values.text(silence.get("reason"))),
            Cell(values.text(silence.get("author"))),
        ]
        for silence in silences
    ]
    blocks.append(Table(("Rule", "From", "Until", "Reason", "Author"), rows, align="lllll"))
    return blocks
