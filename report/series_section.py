"""One series' section of the report, as blocks: its headline against the period before, by day
and by hour, acceptance by draft position, latency against the baseline, and its charts."""

from __future__ import annotations

from typing import Any

from specguard.report import charts, values
from specguard.report.document import Block, Cell, Heading, Image, Paragraph, Table
from specguard.report.model import HEADLINE
from specguard.report.values import BETTER, LABELS, MISSING


def section(series: dict[str, Any], slug: str, images: set[str]) -> list[Block]:
    blocks: list[Block] = [Heading(2, charts.label(series))]
    cost = values.as_number(series.get("draft_cost"))
    source = series.get("draft_cost_source")
    shares = series.get("k_share")
    mixed = ""
    if isinstance(shares, dict) and shares:
        told = [
            f"k = {values.text(k)} for {share * 100:.0f} %"
            for k, share in shares.items()
            if isinstance(share, float | int)
        ]
        mixed = (
            f" (k changed in the period: {', '.join(told)} of the drafts; position i's rate is over the "
            "drafts that had a position i)"
        )
    blocks.append(
        Paragraph(
            f"k = {values.count(series.get('k'))} draft positions counted at the period's end{mixed}; draft cost "
            f"per step c = {MISSING if cost is None else f'{cost:g}'}"
            + (f" ({values.text(source)})" if source else "")
            + "."
        )
    )

    headline = series.get("headline") or {}
    rows = []
    names = list(HEADLINE) + [n for n in headline if n not in HEADLINE]
    for name in names:
        figure = headline.get(name) or {}
        change, tone = values.change(figure.get("change"), BETTER.get(name, 0))
        rows.append(
            [
                Cell(LABELS.get(name, str(name))),
                Cell(values.value(name, figure.get("value"))),
                Cell(values.value(name, figure.get("previous"))),
                Cell("", change or MISSING, tone),
            ]
        )
    blocks += [
        Heading(3, "This period against the one before"),
        Table(("", "This period", "The one before", "Change"), rows),
    ]

    blocks.append(Heading(3, "By day"))
    days = [row for row in series.get("by_day") or [] if isinstance(row, dict)]
    if days:
        rows = [[Cell(values.day(row.get("day"))), *_acceptance_cells(row)] for row in days]
        blocks.append(
            Table(
                ("Day (UTC)", "Acceptance rate", "Mean acceptance length", "Estimated speedup", "Drafts"),
                rows,
            )
        )
    else:
        blocks.append(Paragraph("No data."))

    blocks.append(Heading(3, "By hour of day (UTC)"))
    hours = [row for row in series.get("by_hour_of_day") or [] if isinstance(row, dict)]
    if hours:
        header = ("Hour", *(values.hour(row.get("hour")) for row in hours))
        rates = [values.as_number(row.get("acceptance_rate")) for row in hours]
        lengths = [values.as_number(row.get("mean_acceptance_length")) for row in hours]
        rows = [
            [Cell("Acceptance %"), *(Cell(values.fixed(None if r is None else r * 100, 0)) for r in rates)],
            [Cell("Mean acc. length"), *(Cell(values.fixed(length, 1)) for length in lengths)],
        ]
        blocks.append(Table(header, rows, compact=True))
    else:
        blocks.append(Paragraph("No data."))

    blocks.append(Heading(3, "Acceptance by draft position"))
    positions = [values.as_number(p) for p in series.get("per_position") or []]
    if positions:
        rows = []
        for i, share in enumerate(positions):
            before = 1.0 if i == 0 else positions[i - 1]
            given = None if share is None or not before else share / before
            rows.append([Cell(str(i + 1)), Cell(values.percent(share)), Cell(values.percent(given))])
        headers = ("Position", "Drafts accepted up to it", "Accepted when the one before was")
        blocks.append(Table(headers, rows))
    else:
        blocks.append(Paragraph("No data."))

    blocks.append(Heading(3, "Latency against the baseline"))
    latency = [row for row in series.get("latency") or [] if isinstance(row, dict)]
    if latency:
        rows = []
        for row in latency:
            signal = values.text(row.get("signal"))
            rows.append(
                [
                    Cell(LABELS.get(signal, signal)),
                    Cell(values.value("seconds", row.get("value"))),
                    Cell(values.value("seconds", row.get("baseline"))),
                    Cell(values.ratio(latency_ratio(row))),
                ]
            )
        blocks.append(Table(("Signal", "This period", "Baseline", "Ratio"), rows))
    else:
        blocks.append(Paragraph("No data."))

    shown = [kind for kind in charts.KINDS if charts.name(kind, slug) in images]
    if shown:
        blocks.append(Heading(3, "Charts"))
        blocks += [Image(charts.name(kind, slug), charts.title(kind, series)) for kind in shown]
    return blocks


def _acceptance_cells(row: dict[str, Any]) -> list[Cell]:
    return [
        Cell(values.value("acceptance_rate", row.get("acceptance_rate"))),
        Cell(values.value("mean_acceptance_length", row.get("mean_acceptance_length"))),
        Cell(values.value("estimated_speedup", row.get("estimated_speedup"))),
        Cell(values.value("drafts", row.get("drafts"))),
    ]


def latency_row(series: dict[str, Any], signal: str) -> dict[str, Any]:
    for row in series.get("latency") or []:
        if isinstance(row, dict) and row.get("signal") == signal:
            return row
    return {}


def latency_ratio(row: dict[str, Any]) -> float | None:
    ratio = values.as_number(row.get("ratio"))
    if ratio is not None:
        return ratio
    value, baseline = values.as_number(row.get("value")), values.as_number(row.get("baseline"))
    return None if value is None or not baseline else value / baseline
