"""A report's summary as a Slack message: what someone skimming the channel on Monday needs (how
speculative decoding did this week against the last, what specguard did, what it recommends), with
the full report and its charts elsewhere (the charts go in the message's thread).

Within Slack's limits whatever the report holds (a header's 150 characters, a section's 3,000, 50
blocks, the fallback text cut at 3,000): a long name or many series are cut, never refused, since
a refused message would be retried for nothing. A figure that is missing shows as an en dash.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from specguard.actions.slack.message import BLOCKS_MAX, HEADER_MAX, SECTION_MAX, TEXT_MAX, cut

MISSING = "\u2013"  # an en dash: no data
TIMES = "\u00d7"  # a multiplication sign: 2.40x
RECOMMENDATIONS_SHOWN = 5
RULES_SHOWN = 5
# A name or a title this long is cut, so that one cannot push the rest out of its section.
NAME_MAX = 200
TITLE_MAX = 300

# (headline name, label, how its value is shown)
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("acceptance_rate", "Acceptance rate", "percent"),
    ("mean_acceptance_length", "Mean acceptance length", "plain"),
    ("estimated_speedup", "Estimated speedup", "times"),
)
E2E = "e2e_latency_p95"


def summary(report: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The summary of a report (``report.model``'s shape): (fallback text, Block Kit blocks)."""
    host = _text(report.get("host")) or MISSING
    period = _period(report.get("period"))
    title = f"Weekly report · {host} · {period}"
    series = [s for s in _list(report.get("series")) if isinstance(s, dict)]
    operations, fallback_line, fired = _operations(report)
    recommendations = [r for r in _list(report.get("recommendations")) if isinstance(r, dict)]

    head: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": cut(title, HEADER_MAX), "emoji": True}},
    ]
    generated = _text(report.get("generated_at"))
    if generated:
        head.append(_context(f"Generated {_escape(generated)} · against the period before"))
    tail = [_section(operations), _section(_recommendations(recommendations))]

    room = BLOCKS_MAX - len(head) - len(tail)
    shown = series if len(series) <= room else series[: room - 1]
    body = [_section(_series(s)) for s in shown]
    if len(shown) < len(series):
        body.append(_section(f"…and {len(series) - len(shown)} more series, in the full report"))
    if not series:
        body.append(_section("No speculative-decoding data in this period."))

    lines = [title]
    lines.extend(_series_line(s) for s in series[:10])
    if len(series) > 10:
        lines.append(f"…and {len(series) - 10} more series")
    lines.append(f"{fallback_line}; rules fired: {fired}; recommendations: {len(recommendations)}")
    return cut("\n".join(lines), TEXT_MAX), (head + body + tail)[:BLOCKS_MAX]


# --- the parts -------------------------------------------------------------------------------


def _series(series: dict[str, Any]) -> str:
    headline = _dict(series.get("headline"))
    lines = [f"*{_escape(_name(series))}*"]
    for key, label, style in FIGURES:
        figure = _figure(headline, key)
        lines.append(f"{label}: *{_value(figure.get('value'), style)}* · {_change(figure.get('change'))} w/w")
    e2e = _figure(headline, E2E)
    value = _number(e2e.get("value"))
    baseline = _baseline(series)
    against = f"baseline {_value(baseline, 'seconds')}"
    if value is not None and baseline:
        against += f" ({_change(value / baseline - 1)})"
    lines.append(
        f"E2E latency p95: *{_value(value, 'seconds')}* vs {against} · {_change(e2e.get('change'))} w/w"
    )
    return "\n".join(lines)


def _series_line(series: dict[str, Any]) -> str:
    headline = _dict(series.get("headline"))
    parts = [
        f"{label.lower()} {_value(_figure(headline, key).get('value'), style)} "
        f"({_change(_figure(headline, key).get('change'))})"
        for key, label, style in FIGURES
        if key != "mean_acceptance_length"
    ]
    return f"{_name(series)}: " + ", ".join(parts)


def _operations(report: dict[str, Any]) -> tuple[str, str, str]:
    """The section on what specguard did, the fallback line and the rules' firings (for the text)."""
    fallbacks = report.get("fallbacks")
    if not isinstance(fallbacks, dict):
        fallback_line = f"fallbacks: {MISSING}"
    else:
        count, seconds = _number(fallbacks.get("count")), _number(fallbacks.get("seconds"))
        total = MISSING if seconds is None else _duration(seconds)
        fallback_line = f"fallbacks: {_count(count)} ({total} in total)"
    rules = [r for r in _list(report.get("rules")) if isinstance(r, dict)]
    fired_by = [
        (cut(_text(r.get("rule")) or "?", NAME_MAX), int(_number(r.get("fired")) or 0)) for r in rules
    ]
    fired_by = sorted((f for f in fired_by if f[1] > 0), key=lambda f: -f[1])
    fired = str(sum(n for _, n in fired_by)) if "rules" in report else MISSING
    names = ", ".join(f"{_escape(name)} {TIMES}{n}" for name, n in fired_by[:RULES_SHOWN])
    if len(fired_by) > RULES_SHOWN:
        names += f" and {len(fired_by) - RULES_SHOWN} more"
    section = f"*Fallbacks:* {_escape(fallback_line.removeprefix('fallbacks: '))}\n*Rules fired:* {fired}"
    if names:
        section += f" ({names})"
    return section, fallback_line, fired


def _recommendations(recommendations: list[dict[str, Any]]) -> str:
    if not recommendations:
        return "*Recommendations:* none"
    titles = [
        f"• {_escape(cut(_text(r.get('title')) or MISSING, TITLE_MAX))}"
        for r in recommendations[:RECOMMENDATIONS_SHOWN]
    ]
    if len(recommendations) > RECOMMENDATIONS_SHOWN:
        titles.append(f"…and {len(recommendations) - RECOMMENDATIONS_SHOWN} more in the full report")
    return f"*Recommendations ({len(recommendations)})*\n" + "\n".join(titles)


# --- formatting ------------------------------------------------------------------------------


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut(text, SECTION_MAX)}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": cut(text, SECTION_MAX)}]}


def _name(series: dict[str, Any]) -> str:
    model, instance = _text(series.get("model")) or MISSING, _text(series.get("instance")) or MISSING
    k = _number(series.get("k"))
    name = f"{cut(model, NAME_MAX)} on {cut(instance, NAME_MAX)}"
    return name + (f" (k={k:g})" if k is not None else "")


def _figure(headline: dict[str, Any], key: str) -> dict[str, Any]:
    return _dict(headline.get(key))


def _baseline(series: dict[str, Any]) -> float | None:
    for latency in _list(series.get("latency")):
        if isinstance(latency, dict) and latency.get("signal") == E2E:
            return _number(latency.get("baseline"))
    return None


def _value(value: Any, style: str) -> str:
    number = _number(value)
    if number is None:
        return MISSING
    if style == "percent":
        return f"{number * 100:.1f}%"
    if style == "times":
        return f"{number:.2f}{TIMES}"
    if style == "seconds":
        return f"{number * 1000:.0f} ms" if abs(number) < 1 else f"{number:.2f} s"
    return f"{number:.2f}"


def _change(change: Any) -> str:
    """A relative change as an arrow and a signed percentage: ``↑ +3.0%``, ``↓ -4.6%``."""
    number = _number(change)
    if number is None:
        return MISSING
    percent = number * 100
    if round(percent, 1) == 0:
        return "→ 0.0%"
    return f"{'↑' if percent > 0 else '↓'} {percent:+.1f}%"


def _count(value: float | None) -> str:
    return MISSING if value is None else f"{value:g}"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours / 24:.1f} days"


def _period(period: Any) -> str:
    if not isinstance(period, dict):
        return MISSING
    return f"{_day(period.get('from'))} to {_day(period.get('to'))}"


def _day(value: Any) -> str:
    """An ISO time's day (the report's periods start and end at midnight UTC)."""
    text = _text(value)
    if not text:
        return MISSING
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    return (
        at.strftime("%Y-%m-%d")
        if (at.hour, at.minute, at.second) == (0, 0, 0)
        else at.strftime("%Y-%m-%d %H:%M")
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _escape(text: str) -> str:
    """Slack's mrkdwn needs &, < and > escaped; everything else is shown as is."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
