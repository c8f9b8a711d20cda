"""The report's charts as PNG images, drawn with matplotlib when it is installed.

matplotlib is an optional extra (``specguard[charts]``): a serving host that only runs the daemon
should not need it, so it is imported inside the functions that draw, and a report without it says
what to install instead of failing. The figures are ``matplotlib.figure.Figure`` objects made
directly, never through pyplot: no global figure registry to leak into and no backend to select,
so drawing is safe from any thread, and a figure is freed as soon as it is dropped.

``timeline`` draws a rule's series over a period (its value, threshold, pending and firing) for
the backtest's page, which shares these charts' size, style and optional dependency.
"""

from __future__ import annotations

import importlib
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from specguard.report.model import LATENCY, Report
from specguard.rules.durations import format_duration

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from numpy.typing import ArrayLike

INSTALL = "charts need matplotlib: pip install 'specguard[charts]'"

# The kinds of chart each series gets, in the order the report shows them.
KINDS: tuple[str, ...] = ("acceptance-week", "per-position", "latency")

_SIZE = (8.0, 3.0)  # inches; at _DPI an 800 x 300 image, legible in a mail client and small
_DPI = 100
_ACCEPTANCE = "#1f6fb4"
_LENGTH = "#d9822b"
_BASELINE = "#9aa5b1"
_THRESHOLD = "#56606d"


@dataclass(frozen=True)
class Chart:
    """One chart: ``name`` is a file stem, unique in the report, e.g. ``acceptance-week-<slug>``."""

    name: str
    title: str
    png: bytes
    alt: str


def available() -> str | None:
    """None when charts can be drawn, else what to install (the report shows it in their place)."""
    try:
        importlib.import_module("matplotlib.figure")
        importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError:
        return INSTALL
    return None


def label(series: dict[str, Any]) -> str:
    """How the report names a series for people: the model, then where it runs."""
    return f"{series.get('model') or '?'} on {series.get('instance') or '?'}"


def slugs(report: Report) -> list[str]:
    """A file-name-safe stem for each series, in order, unique within the report.

    Made from the instance and model, which come from vLLM's labels and may hold any character;
    two series that reduce to the same stem get a numeric suffix rather than overwrite each other's
    images.
    """
    seen: set[str] = set()
    result: list[str] = []
    for series in report.get("series") or []:
        text = f"{series.get('model') or ''}-{series.get('instance') or ''}".lower()
        base = re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:60].strip("-") or "series"
        slug, n = base, 1
        while slug in seen:
            n += 1
            slug = f"{base}-{n}"
        seen.add(slug)
        result.append(slug)
    return result


def name(kind: str, slug: str) -> str:
    """The chart's file stem, which the renderings use to find its image."""
    return f"{kind}-{slug}"


def title(kind: str, series: dict[str, Any]) -> str:
    """The chart's caption (also its alt text when the renderer only has the image's name)."""
    what = {
        "acceptance-week": "Acceptance over the week",
        "per-position": "Acceptance by draft position",
        "latency": "Latency against the baseline",
    }[kind]
    return f"{what}: {label(series)}"


def charts(report: Report) -> list[Chart]:
    """Every chart of the report: per series, acceptance over the week, acceptance per draft
    position and latency against the baseline, each left out when the series has no data for it.
    Raises RuntimeError (with what to install) when matplotlib is missing."""
    missing = available()
    if missing is not None:
        raise RuntimeError(missing)
    result: list[Chart] = []
    for series, slug in zip(report.get("series") or [], slugs(report), strict=True):
        for kind, draw in (
            ("acceptance-week", _acceptance_week),
            ("per-position", _per_position),
            ("latency", _latency),
        ):
            drawn = draw(series)
            if drawn is not None:
                png, alt = drawn
                result.append(Chart(name(kind, slug), title(kind, series), png, alt))
    return result


def _figure() -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    return figure


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=_DPI)
    finally:
        figure.clear()  # drop the artists now rather than when the collector gets round to it
    return buffer.getvalue()


def _number(value: Any) -> float:
    """A plotted value: None (no data) becomes NaN, which matplotlib leaves as a gap."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _title(axes: Axes, text: str) -> None:
    # parse_math off: a model named "$x$" must print as such, not as TeX (nor fail to parse)
    axes.set_title(text, loc="left", fontsize=10, parse_math=False)


def _acceptance_week(series: dict[str, Any]) -> tuple[bytes, str] | None:
    points: list[tuple[datetime, float, float]] = []
    for row in series.get("hourly") or []:
        if not isinstance(row, dict):
            continue
        try:
            at = datetime.fromisoformat(str(row.get("at")))
        except ValueError:
            continue
        rate = _number(row.get("acceptance_rate")) * 100
        points.append((at, rate, _number(row.get("mean_acceptance_length"))))
    points.sort(key=lambda point: point[0])
    known_rates = [rate for _, rate, _ in points if not math.isnan(rate)]
    if not known_rates:
        return None
    known_lengths = [length for _, _, length in points if not math.isnan(length)]
    # hours since the first midnight: plain numbers, with a tick at each day
    start = points[0][0].replace(hour=0, minute=0, second=0, microsecond=0)
    hours = [(at - start).total_seconds() / 3600 for at, _, _ in points]
    days = range(0, int(hours[-1] // 24) + 1)
    figure = _figure()
    axes = figure.add_subplot()
    # A marker as well when the points are few: one hour alone is no line at all.
    marker = "o" if len(points) <= 24 else None
    axes.plot(
        hours, [rate for _, rate, _ in points], color=_ACCEPTANCE, linewidth=1.2, marker=marker, markersize=4
    )
    axes.set_ylabel("acceptance rate (%)", color=_ACCEPTANCE, fontsize=9)
    axes.set_ylim(0, 100)
    axes.set_xlim(0, max(hours[-1] + 1, 24))
    axes.set_xticks(
        [day * 24 for day in days], [(start + timedelta(days=day)).strftime("%a %d %b") for day in days]
    )
    axes.grid(True, alpha=0.3)
    axes.tick_params(labelsize=8)
    k = _number(series.get("k"))
    rates = [rate for _, rate, _ in points]
    lengths = [length for _, _, length in points]
    if known_lengths and _same_line(rates, lengths, k):
        # vLLM's mean acceptance length is 1 + k x the rate while k stays put: one line, two scales
        import numpy

        def to_length(rate: ArrayLike) -> ArrayLike:
            return 1 + k * numpy.asarray(rate, dtype=float) / 100

        def to_rate(length: ArrayLike) -> ArrayLike:
            return (numpy.asarray(length, dtype=float) - 1) * 100 / k

        scale = axes.secondary_yaxis("right", functions=(to_length, to_rate))
        scale.set_ylabel("mean acceptance length", color=_ACCEPTANCE, fontsize=9)
        scale.tick_params(labelsize=8)
    elif known_lengths:  # k changed during the week (or is unknown): a line of its own
        twin = axes.twinx()
        twin.plot(hours, lengths, color=_LENGTH, linewidth=1.0, alpha=0.85)
        twin.set_ylabel("mean acceptance length", color=_LENGTH, fontsize=9)
        twin.set_ylim(1, max(max(known_lengths) * 1.15, 2))
        twin.tick_params(labelsize=8)
    _title(axes, f"Hourly acceptance (UTC), {label(series)}")
    alt = (
        f"Hourly acceptance rate of {label(series)} over the week: between {min(known_rates):.0f} % and "
        f"{max(known_rates):.0f} %"
    )
    if known_lengths:
        alt += f"; mean acceptance length between {min(known_lengths):.2f} and {max(known_lengths):.2f}"
    gaps = len(points) - len(known_rates)
    if gaps:
        alt += f"; {gaps} hour{'s' if gaps != 1 else ''} without data"
    return _png(figure), alt + "."


def _same_line(rates: list[float], lengths: list[float], k: float) -> bool:
    """Whether every hour's mean acceptance length is 1 + k x its rate (within rounding)."""
    if math.isnan(k) or k <= 0:
        return False
    return all(
        math.isnan(rate) or math.isnan(length) or abs(1 + k * rate / 100 - length) < 0.02 * k
        for rate, length in zip(rates, lengths, strict=True)
    )


def _per_position(series: dict[str, Any]) -> tuple[bytes, str] | None:
    values = [_number(v) * 100 for v in series.get("per_position") or []]
    if not any(not math.isnan(v) for v in values):
        return None
    positions = [str(i + 1) for i in range(len(values))]
    figure = _figure()
    axes = figure.add_subplot()
    bars = axes.bar(positions, [0.0 if math.isnan(v) else v for v in values], color=_ACCEPTANCE, width=0.6)
    axes.bar_label(bars, labels=["no data" if math.isnan(v) else f"{v:.0f} %" for v in values], fontsize=8)
    axes.set_ylim(0, 105)
    axes.set_xlabel("draft position", fontsize=9)
    axes.set_ylabel("drafts accepted up to it (%)", fontsize=9)
    axes.grid(True, axis="y", alpha=0.3)
    axes.tick_params(labelsize=8)
    _title(axes, f"Acceptance by draft position, {label(series)}")
    shown = ", ".join(
        f"{p}: {'no data' if math.isnan(v) else f'{v:.0f} %'}" for p, v in zip(positions, values, strict=True)
    )
    return _png(figure), f"Share of drafts accepted up to each position for {label(series)}: {shown}."


def _short(signal: str) -> str:
    """``e2e_latency_p95`` as ``e2e p95``: six panel titles share 8 inches."""
    words = signal.replace("e2e_latency", "e2e").split("_")
    return " ".join(word.upper() if word in ("ttft", "itl") else word for word in words)


def _latency(series: dict[str, Any]) -> tuple[bytes, str] | None:
    rows = [
        row
        for row in series.get("latency") or []
        if isinstance(row, dict) and not math.isnan(_number(row.get("baseline")))
    ]
    if not rows:
        return None
    order = {signal: i for i, signal in enumerate(LATENCY)}
    rows.sort(key=lambda row: order.get(str(row.get("signal")), len(order)))
    figure = _figure()
    # a panel per signal, each on its own scale: an inter-token latency of 20 ms would not show
    # beside an end-to-end latency of 2 s
    panels = figure.subplots(1, len(rows), squeeze=False)[0]
    parts = []
    for axes, row in zip(panels, rows, strict=True):
        signal = str(row.get("signal"))
        value, baseline = _number(row.get("value")), _number(row.get("baseline"))
        scale, unit, digits = (1.0, "s", 2) if max(value, baseline) >= 1 else (1000.0, "ms", 0)
        axes.bar(
            ["week", "baseline"],
            [0.0 if math.isnan(value) else value * scale, baseline * scale],
            color=[_ACCEPTANCE, _BASELINE],
            width=0.7,
        )
        axes.set_title(_short(signal), fontsize=9, parse_math=False)
        axes.set_ylabel(unit, fontsize=8, labelpad=1)
        axes.tick_params(labelsize=7)
        axes.grid(True, axis="y", alpha=0.3)
        shown = "no data" if math.isnan(value) else f"{value * scale:.{digits}f} {unit}"
        parts.append(f"{signal} {shown} (baseline {baseline * scale:.{digits}f} {unit})")
    figure.suptitle(f"Latency against the baseline, {label(series)}", fontsize=10, x=0.01, ha="left")
    return _png(figure), f"Latency of {label(series)} this week against its baseline: {'; '.join(parts)}."


# A timeline's lines are drawn from at most two points per stretch of time, _STRETCHES of them
# over its width (the lowest and the highest value of each, so that a dip shorter than a pixel still
# shows): a week at one-minute steps, 10,080 evaluations, draws as 1,600 points.
_STRETCHES = 800
_SHADED = {"pending": ("#e0a526", 0.28), "firing": ("#c0362c", 0.22)}  # colour, opacity


def timeline(
    times: Sequence[float],
    values: Sequence[float],
    thresholds: Sequence[float],
    states: Sequence[str],
    title: str,
    ylabel: str,
    period: tuple[float, float] | None = None,
) -> tuple[bytes, str] | None:
    """One series of a rule over a period, as a PNG and its alt text: its value at each evaluation,
    the threshold it was judged against, and the time it was pending or firing shaded.

    ``times`` are Unix times (shown in UTC); ``values`` and ``thresholds`` are NaN where there was
    none (a gap); ``states`` is the series' state after each evaluation, ``pending`` and ``firing``
    shaded up to the next. ``period``: the axis's extent (default: the evaluations'). None when
    there is no evaluation. Raises RuntimeError (with what to install) without matplotlib,
    ValueError for sequences of different lengths."""
    missing = available()
    if missing is not None:
        raise RuntimeError(missing)
    if not len(times) == len(values) == len(thresholds) == len(states):
        raise ValueError("a timeline needs as many values, thresholds and states as times")
    if not times:
        return None
    from matplotlib import dates

    at = [float(t) for t in times]
    last = at[-1] + (at[-1] - at[-2] if len(at) > 1 else 60.0)  # the last state holds one more step
    start, end = period if period is not None else (at[0], last)
    spans = {state: _spans(at, states, state, min(last, end)) for state in _SHADED}
    zero = dates.date2num(_utc(0))  # type: ignore[no-untyped-call]  # Unix time 0 as matplotlib's days

    def axis(t: float) -> float:
        return float(zero) + t / 86400

    figure = _figure()
    axes = figure.add_subplot()
    lines = [(values, "value", "-", _ACCEPTANCE), (thresholds, "threshold", "--", _THRESHOLD)]
    shown = []
    for sequence, name, style, colour in lines:
        numbers = [_number(v) for v in sequence]
        shown.append([v for v in numbers if not math.isnan(v)])
        if shown[-1]:
            xs, ys = _envelope(at, numbers)
            # a marker as well when the values are few: one between gaps is no line at all
            marker = "o" if len(shown[-1]) <= 60 and name == "value" else None
            axes.plot([axis(t) for t in xs], ys, style, color=colour, linewidth=1.1, marker=marker,
                      markersize=3, label=name)  # fmt: skip
    for state, (colour, opacity) in _SHADED.items():
        if spans[state]:  # the whole height (axes coordinates), whatever the values' scale
            axes.broken_barh([(axis(a), (b - a) / 86400) for a, b in spans[state]], (0, 1),
                             transform=axes.get_xaxis_transform(), facecolor=colour, alpha=opacity,
                             linewidth=0, label=state)  # fmt: skip
    if not any(shown):
        axes.set_yticks([])
    axes.set_xlim(axis(min(start, at[0])), axis(max(end, at[-1])))
    locator = dates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=UTC))  # type: ignore[no-untyped-call]
    axes.set_ylabel(ylabel, fontsize=9)
    axes.set_xlabel("UTC", fontsize=8)
    axes.grid(True, alpha=0.3)
    axes.tick_params(labelsize=8)
    if any(shown) or any(spans.values()):  # else no artist has a label, and matplotlib warns
        figure.legend(loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    _title(axes, title)
    return _png(figure), _timeline_alt(title, at, shown[0], shown[1], spans)


def _utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


def _spans(at: Sequence[float], states: Sequence[str], state: str, last: float) -> list[tuple[float, float]]:
    """The stretches of time the series was in ``state``: from the evaluation that found it so to
    the next evaluation that did not (``last`` for the final one)."""
    out: list[tuple[float, float]] = []
    begun: float | None = None
    for t, now in zip(at, states, strict=True):
        if now == state and begun is None:
            begun = t
        elif now != state and begun is not None:
            out.append((begun, t))
            begun = None
    if begun is not None:
        out.append((begun, max(last, begun)))
    return out


def _envelope(at: Sequence[float], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most two points per stretch of ``_STRETCHES``, its lowest and highest known value in their
    order of time, or a gap (NaN) for a stretch without any."""
    if len(at) <= 2 * _STRETCHES:
        return list(at), list(values)
    size = math.ceil(len(at) / _STRETCHES)
    xs: list[float] = []
    ys: list[float] = []
    for first in range(0, len(at), size):
        known = [i for i in range(first, min(first + size, len(at))) if not math.isnan(values[i])]
        picked = (
            sorted({min(known, key=values.__getitem__), max(known, key=values.__getitem__)}) if known else []
        )
        xs += [at[i] for i in picked] or [at[first]]
        ys += [values[i] for i in picked] or [math.nan]
    return xs, ys


def _timeline_alt(
    title: str,
    at: Sequence[float],
    known: Sequence[float],
    limits: Sequence[float],
    spans: Mapping[str, Sequence[tuple[float, float]]],
) -> str:
    """What the timeline shows, in words: its range of values and threshold, and its shaded time."""
    plural = "s" if len(at) != 1 else ""
    parts = [
        f"{title}: {len(at)} evaluation{plural} from {_utc(at[0]):%Y-%m-%d %H:%M} to {_utc(at[-1]):%Y-%m-%d %H:%M} UTC"
    ]
    if known:
        parts.append(f"value between {min(known):.4g} and {max(known):.4g}")
    if len(known) < len(at):
        parts.append(f"{len(at) - len(known)} without a value")
    if limits:
        low, high = min(limits), max(limits)
        parts.append(f"threshold {low:.4g}" if low == high else f"threshold between {low:.4g} and {high:.4g}")
    for state, stretches in spans.items():
        if stretches:
            total = format_duration(round(sum(b - a for a, b in stretches)))
            parts.append(f"{state} {len(stretches)} time{'s' if len(stretches) != 1 else ''}, {total} in all")
    if not any(spans.values()):
        parts.append("never pending or firing")
    return "; ".join(parts) + "."
