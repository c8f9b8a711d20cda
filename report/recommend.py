"""The report's recommendations: what to change, each with the numbers and the reasoning behind it.

Three kinds, each computed per series (instance, model) of the report's "series" list:

* ``num_speculative_tokens``: the k with the best expected speedup from the measured per-position
  acceptance and the draft's cost, and whether it beats the current k by enough to restart vLLM.
* ``speculation_lost``: hours of the day where speculation is estimated slower than plain decoding,
  and latency signals well above their baseline.
* ``draft_degrading``: the draft's acceptance falling week over week.

Text rounds to 3 significant digits; ``data`` keeps the numbers as computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime, timedelta
from typing import Any

from specguard.metrics.ktable import fmt as _fmt
from specguard.metrics.ktable import k_inputs, k_table
from specguard.metrics.speedup import K_MAX, BestK, best_k
from specguard.report.model import change

Series = Mapping[str, Any]
Recommendation = dict[str, Any]

# A new k must promise at least this much more speed: changing k restarts vLLM, and a smaller gain is
# within the week-to-week drift of the measured rates and the error of the speedup model itself.
MIN_GAIN_TO_CHANGE_K = 0.03

# Below a speedup of 1 the drafting costs more time than the accepted tokens save.
SPEEDUP_FLOOR = 1.0

# A latency more than 10 % over its baseline is beyond the run-to-run spread of a benchmark (medians of
# repeated runs agree within a few percent) and is felt by users.
LATENCY_RATIO_LIMIT = 1.10

# A relative week-over-week fall in acceptance larger than this is more than traffic noise: a week of
# drafts is hundreds of thousands of them, and a healthy draft's weekly rates move by a few percent.
DEGRADING_RELATIVE_DROP = 0.05

# Two days always make a line; three are the fewest whose slope says something about a trend.
MIN_TREND_DAYS = 3

# An hour is judged on its own only with this many drafts: a few stray requests in a quiet hour say
# little (a hundred drafts of k tokens put the hour's acceptance within a few points).
MIN_DRAFTS_IN_HOUR = 100


def recommendations(
    series: list[dict[str, Any]], previous: list[dict[str, Any]] | None = None
) -> list[Recommendation]:
    """Every recommendation for the week's ``series``; ``previous`` is the week before's, if known."""
    before = {_key(item): item for item in previous or []}
    found: list[Recommendation] = []
    for item in series:
        for made in (
            _num_speculative_tokens(item),
            _speculation_lost(item),
            _draft_degrading(item, before.get(_key(item))),
        ):
            if made is not None:
                found.append(made)
    return found


def _key(series: Series) -> tuple[object, object]:
    return series.get("instance"), series.get("model")


def _recommendation(
    kind: str, series: Series, title: str, reasoning: list[str], data: dict[str, Any]
) -> Recommendation:
    return {
        "kind": kind,
        "instance": series.get("instance"),
        "model": series.get("model"),
        "title": title,
        "reasoning": reasoning,
        "data": data,
    }


def _percent(ratio: float) -> str:
    return f"{_fmt(ratio * 100)} %"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _per_position(series: Series) -> list[float] | None:
    """The series' p_i, or None when any is missing: a partial list would bias the extrapolation."""
    raw = series.get("per_position")
    if not isinstance(raw, list) or not raw:
        return None
    rates = [_number(value) for value in raw]
    return None if any(rate is None for rate in rates) else [rate for rate in rates if rate is not None]


# --- num_speculative_tokens ---------------------------------------------------------------------


def _num_speculative_tokens(series: Series) -> Recommendation | None:
    k = series.get("k")
    per_position = _per_position(series)
    if not isinstance(k, int) or k < 1 or per_position is None:
        return None  # nothing to judge: no speculation measured
    cost = _number(series.get("draft_cost"))
    source = series.get("draft_cost_source")
    if cost is None:
        why = f" ({source})" if source else ""
        return _recommendation(
            "num_speculative_tokens",
            series,
            f"k = {k} cannot be judged without the draft's cost",
            [
                "The expected speedup of k speculative tokens is (1 + Σ_{i<k} p_i) / (1 + k·c), with c the "
                f"time of one draft step over one target step; c is unknown{why}.",
                "Set speculative.draft_cost (or a speculative.method with a known cost) in the baseline "
                "file's entry for this model to have k judged.",
            ],
            {"k": k, "draft_cost": None, "per_position": per_position},
        )
    result = best_k(per_position, cost, k_max=max(K_MAX, k), current_k=k)
    gain = result.gain if result.gain is not None else 0.0
    change_k = result.k != k and gain >= MIN_GAIN_TO_CHANGE_K
    title = f"set num_speculative_tokens to {result.k} (now {k})" if change_k else f"keep k = {k}"
    reasoning = [
        *k_inputs(per_position, cost, source),
        *k_table(result, per_position),
        _k_choice(result, k, gain, change_k),
    ]
    if result.speedup < SPEEDUP_FLOOR:
        reasoning.append(
            f"Even the best k is estimated slower than plain decoding (speedup {_fmt(result.speedup)}): "
            "at this c the draft costs more than its accepted tokens save."
        )
    data = {
        "k": k,
        "recommended_k": result.k if change_k else k,
        "best_k": result.k,
        "draft_cost": cost,
        "draft_cost_source": source,
        "per_position": per_position,
        "current_speedup": result.current_speedup,
        "best_speedup": result.speedup,
        "gain": gain,
        "min_gain": MIN_GAIN_TO_CHANGE_K,
        "table": [
            {"k": row.k, "speedup": row.speedup, "extrapolated": row.extrapolated} for row in result.table
        ],
    }
    return _recommendation("num_speculative_tokens", series, title, reasoning, data)


def _k_choice(result: BestK, k: int, gain: float, change_k: bool) -> str:
    threshold = _percent(MIN_GAIN_TO_CHANGE_K)
    current = _fmt(result.current_speedup or 0.0)
    if result.k == k:
        return f"The current k = {k} has the highest expected speedup ({current}): keep it."
    compared = (
        f"k = {result.k} is expected {_percent(gain)} faster than the current k = {k} "
        f"({_fmt(result.speedup)} against {current})"
    )
    if not change_k:
        return f"{compared}: under the {threshold} a change of k needs to pay for a restart; keep k = {k}."
    choice = f"{compared}, at least the {threshold} a change needs: set num_speculative_tokens to {result.k}."
    if result.extrapolated:
        choice += (
            f" k = {result.k} goes past the measured positions, so its speedup rests on the extrapolation: "
            "check the per-position rates after the change."
        )
    return choice


# --- speculation_lost ---------------------------------------------------------------------------


def _lost(entry: Mapping[str, Any]) -> bool:
    speedup = _number(entry.get("estimated_speedup"))
    return speedup is not None and speedup < SPEEDUP_FLOOR


def _lost_spans(series: Series) -> list[list[Mapping[str, Any]]]:
    """Runs of consecutive hours of the period (``hourly``) estimated slower than plain decoding:
    a Tuesday afternoon's collapse, which the week's average for that hour of the day hides."""
    spans: list[list[Mapping[str, Any]]] = []
    last: datetime | None = None
    for entry in _entries(series.get("hourly")):
        drafts = _number(entry.get("drafts")) or 0.0
        at = _time(entry.get("at"))
        if at is None or drafts < MIN_DRAFTS_IN_HOUR or not _lost(entry):
            continue
        if spans and last is not None and at - last == timedelta(hours=1):
            spans[-1].append(entry)
        else:
            spans.append([entry])
        last = at
    return spans


def _time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _span_text(span: list[Mapping[str, Any]]) -> str:
    first, last = _time(span[0].get("at")), _time(span[-1].get("at"))
    assert first is not None and last is not None
    end = last + timedelta(hours=1)
    return f"{first:%a %Y-%m-%d %H:%M}-{end:%H:%M} UTC"


def _speculation_lost(series: Series) -> Recommendation | None:
    spans = _lost_spans(series)
    hours = [entry for entry in _entries(series.get("by_hour_of_day")) if _lost(entry)]
    latency = [
        entry
        for entry in _entries(series.get("latency"))
        if (ratio := _number(entry.get("ratio"))) is not None and ratio > LATENCY_RATIO_LIMIT
    ]
    if not spans and not hours and not latency:
        return None
    reasoning: list[str] = []
    parts: list[str] = []
    if spans or hours:
        reasoning.append(
            "Estimated speedup = mean acceptance length / (1 + k·c); below "
            f"{_fmt(SPEEDUP_FLOOR)} the drafting costs more time than the accepted tokens save."
        )
    if spans:
        parts.append(f"slower than plain decoding on {', '.join(_span_text(span) for span in spans)}")
        reasoning.append(
            f"Hour by hour (hours with at least {MIN_DRAFTS_IN_HOUR} drafts), speculation lost in "
            f"{len(spans)} stretch{'es' if len(spans) > 1 else ''} of the period:"
        )
        for span in spans:
            reasoning.append(f"{_span_text(span)}:")
            reasoning.extend(f"  {_hour_line(entry, str(entry.get('at')))}" for entry in span)
    if hours:
        parts.append(f"slower than plain decoding at {', '.join(_hour(entry) for entry in hours)} on average")
        reasoning.append("By hour of the day, over the whole period:")
        reasoning.extend(_hour_line(entry) for entry in hours)
        reasoning.append(
            "Speculation pays least under load (large batches make the target's step compute-bound): "
            "at these hours fewer speculative tokens, or none, would serve faster."
        )
    if latency:
        names = ", ".join(str(entry.get("signal")) for entry in latency)
        parts.append(f"{names} above {_fmt(LATENCY_RATIO_LIMIT)}x baseline")
        reasoning.append(
            f"Latency above {_fmt(LATENCY_RATIO_LIMIT)} times its baseline (beyond the spread of repeated "
            "benchmark runs):"
        )
        reasoning.extend(_latency_line(entry) for entry in latency)
    return _recommendation(
        "speculation_lost",
        series,
        "speculation lost: " + "; ".join(parts),
        reasoning,
        {
            "spans": [
                {"from": span[0].get("at"), "hours": len(span), "hourly": [dict(entry) for entry in span]}
                for span in spans
            ],
            "min_drafts_in_hour": MIN_DRAFTS_IN_HOUR,
            "hours": [dict(entry) for entry in hours],
            "latency": [dict(entry) for entry in latency],
            "speedup_floor": SPEEDUP_FLOOR,
            "latency_ratio_limit": LATENCY_RATIO_LIMIT,
        },
    )


def _entries(raw: object) -> list[Mapping[str, Any]]:
    return [entry for entry in raw if isinstance(entry, Mapping)] if isinstance(raw, list) else []


def _hour(entry: Mapping[str, Any]) -> str:
    hour = entry.get("hour")
    return f"{hour:02d}:00 UTC" if isinstance(hour, int) else f"hour {hour} UTC"


def _hour_line(entry: Mapping[str, Any], when: str | None = None) -> str:
    line = (
        when or _hour(entry)
    ) + f": estimated speedup {_fmt(_number(entry.get('estimated_speedup')) or 0.0)}"
    details = [
        f"{label} {_fmt(value)}"
        for label, key in (
            ("acceptance rate", "acceptance_rate"),
            ("mean acceptance length", "mean_acceptance_length"),
            ("drafts", "drafts"),
        )
        if (value := _number(entry.get(key))) is not None
    ]
    return line + (f" ({', '.join(details)})" if details else "")


def _latency_line(entry: Mapping[str, Any]) -> str:
    value, baseline = _number(entry.get("value")), _number(entry.get("baseline"))
    ratio = _number(entry.get("ratio")) or 0.0
    measured = f" {_fmt(value)} s" if value is not None else ""
    against = f" against a baseline of {_fmt(baseline)} s" if baseline is not None else ""
    return f"{entry.get('signal')}{measured}{against}: {_fmt(ratio)} times the baseline."


# --- draft_degrading ----------------------------------------------------------------------------


def _draft_degrading(series: Series, before: Series | None) -> Recommendation | None:
    rate = _week_over_week(series, before, "acceptance_rate")
    length = _week_over_week(series, before, "mean_acceptance_length")
    slope, days = _daily_slope(series.get("by_day"), "acceptance_rate")
    rate_fell = _fell(rate) and slope is not None and slope < 0
    length_fell = _fell(length)
    if not (rate_fell or length_fell):
        return None
    k = series.get("k")
    k_before = before.get("k") if before is not None else series.get("k_previous")
    reasoning = [
        _change_line("Acceptance rate", rate),
        _trend_line(slope, days),
        _change_line("Mean acceptance length", length),
        "The acceptance rate (accepted / drafted tokens) falls when k rises even with the same draft; the "
        "mean acceptance length (1 + accepted tokens per draft) falls when k falls. A fall of more than "
        f"{_percent(DEGRADING_RELATIVE_DROP)} counts: in the acceptance rate together with a falling daily "
        "trend, or in the mean acceptance length alone.",
    ]
    if isinstance(k_before, int) and isinstance(k, int) and k_before != k:
        reasoning.append(f"k changed from {k_before} to {k} between the weeks: part of the change is k's.")
    reasoning.append(
        "A draft falls behind when the traffic drifts from what it was trained on, or when the target "
        "changed without the draft."
    )
    fired_on: list[str] = []
    title_parts: list[str] = []
    for name, fell, figures in (
        ("acceptance_rate", rate_fell, rate),
        ("mean_acceptance_length", length_fell, length),
    ):
        relative = figures["change"]
        if fell and relative is not None:
            fired_on.append(name)
            title_parts.append(f"{name.replace('_', ' ')} {_signed_percent(relative)} week over week")
    title = "draft acceptance falling: " + ", ".join(title_parts)
    return _recommendation(
        "draft_degrading",
        series,
        title,
        reasoning,
        {
            "acceptance_rate": rate,
            "mean_acceptance_length": length,
            "daily_slope": slope,
            "days": days,
            "k": k,
            "k_previous": k_before,
            "fired_on": fired_on,
            "relative_drop": DEGRADING_RELATIVE_DROP,
            "min_trend_days": MIN_TREND_DAYS,
        },
    )


def _week_over_week(series: Series, before: Series | None, name: str) -> dict[str, float | None]:
    """This week's figure, the week before's (the headline's, else last week's series'), the change."""
    figures = _headline(series, name)
    value, previous = _number(figures.get("value")), _number(figures.get("previous"))
    if previous is None and before is not None:
        previous = _number(_headline(before, name).get("value"))
    return {"value": value, "previous": previous, "change": change(value, previous)}


def _headline(series: Series, name: str) -> Mapping[str, Any]:
    headline = series.get("headline")
    figures = headline.get(name) if isinstance(headline, Mapping) else None
    return figures if isinstance(figures, Mapping) else {}


def _fell(figures: Mapping[str, float | None]) -> bool:
    relative = figures["change"]
    return relative is not None and relative < -DEGRADING_RELATIVE_DROP


def _daily_slope(by_day: object, name: str) -> tuple[float | None, int]:
    """Least-squares slope of ``name`` per calendar day over the days with data, and how many there are.

    Unweighted: each day counts once, whatever its number of drafts. None under MIN_TREND_DAYS days.
    """
    points: list[tuple[float, float]] = []
    for entry in _entries(by_day):
        value, day = _number(entry.get(name)), entry.get("day")
        if value is None or not isinstance(day, str):
            continue
        try:
            points.append((float(date.fromisoformat(day).toordinal()), value))
        except ValueError:
            continue
    if len(points) < MIN_TREND_DAYS:
        return None, len(points)
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None, len(points)  # every point on one day: no slope
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread, len(points)


def _change_line(label: str, figures: Mapping[str, float | None]) -> str:
    value, previous, relative = figures["value"], figures["previous"], figures["change"]
    if value is None or previous is None or relative is None:
        return f"{label}: no week-over-week comparison (no figure for one of the weeks)."
    return (
        f"{label} {_fmt(value)} this week against {_fmt(previous)} the week before: "
        f"{_signed_percent(relative)}."
    )


def _trend_line(slope: float | None, days: int) -> str:
    if slope is None:
        plural = "s" if days != 1 else ""
        return f"Daily acceptance rate: {days} day{plural} with data, {MIN_TREND_DAYS} needed for a trend."
    direction = "falling" if slope < 0 else "not falling"
    return f"Daily acceptance rate over {days} days: least-squares slope {_fmt(slope)} per day ({direction})."


def _signed_percent(ratio: float) -> str:
    return ("+" if ratio > 0 else "") + _percent(ratio)
