"""Slack messages an on-call engineer can act on at 3 a.m.: Block Kit, with a plain-text fallback,
kept within Slack's limits (a header's 150 characters, a section's 3,000, a field's 2,000, ten
fields, 50 blocks)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

HEADER_MAX = 150
SECTION_MAX = 3000
FIELD_MAX = 2000
FIELDS_MAX = 10
BLOCKS_MAX = 50
TEXT_MAX = 3000  # the fallback text: notifications show its start; 40,000 is Slack's own limit

ICONS = {"critical": ":red_circle:", "warning": ":large_orange_circle:", "info": ":large_blue_circle:"}
LINKS = (("runbook_url", "Runbook"), ("dashboard_url", "Dashboard"))


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clock(at: float | None) -> str:
    return "-" if at is None else time.strftime("%H:%M:%S UTC", time.gmtime(at))


def _escape(text: str) -> str:
    """Slack's mrkdwn needs &, < and > escaped; everything else is shown as is."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _number(value: float | None) -> str:
    return "no data" if value is None else f"{value:.4g}"


def notice(
    incident: Mapping[str, Any], resolved: Mapping[str, Any] | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """The incident's parent message: (fallback text, blocks). ``incident`` holds what the firing
    said: rule, severity, host, labels, value, threshold, summary, fired_at, since (when the breach
    began, or None), annotations and ``actions`` (each action's outcome: name, detail, at);
    ``resolved`` (at, value, summary: what the resolution said) once resolved. A resolved
    incident leads with its resolution's words, the firing's kept below as what was said then."""
    severity = str(incident.get("severity", "warning"))
    rule = str(incident["rule"])
    labels: Mapping[str, str] = incident.get("labels", {})
    where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "all series"
    state = "RESOLVED" if resolved else "FIRING"
    icon = ":white_check_mark:" if resolved else ICONS.get(severity, ":large_orange_circle:")
    header = cut(f"{state} · {severity.upper()} · {rule}", HEADER_MAX)
    fields = [
        ("Host", str(incident.get("host", "-"))),
        ("Model", str(labels.get("model_name") or labels.get("model") or "-")),
        ("Series", where),
        ("Value", f"{_number(incident.get('value'))} (threshold {_number(incident.get('threshold'))})"),
    ]
    fired, since = incident.get("fired_at"), incident.get("since")
    if since is not None and fired is not None:
        fields.append(
            ("Breaching since", f"{clock(since)} (fired {_duration(float(fired) - float(since))} later)")
        )
    else:
        fields.append(("Fired at", clock(fired)))
    if resolved:
        lasted = float(resolved["at"]) - float(incident.get("fired_at") or resolved["at"])
        fields.append(("Resolved at", f"{clock(resolved['at'])}, after {_duration(lasted)}"))
    fired_said = str(incident.get("summary", ""))
    said = str(resolved.get("summary") or "") if resolved else ""
    lead = (
        f"{icon} {_escape(said)}\nFired: {_escape(fired_said)}" if said else f"{icon} {_escape(fired_said)}"
    )
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"{header}", "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text": cut(lead, SECTION_MAX)}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": cut(f"*{name}*\n{_escape(value)}", FIELD_MAX)}
                for name, value in fields[:FIELDS_MAX]
            ],
        },
    ]
    outcomes: Sequence[Mapping[str, Any]] = incident.get("actions", ())
    if outcomes:
        # how long after the breach began (the drop), or after the firing when that is not known
        start, after = (since, "the breach began") if since is not None else (fired, "firing")
        lines = [
            f"• *{_escape(str(o['name']))}* at {clock(o.get('at'))}"
            + (
                f" ({_duration(float(o['at']) - float(start))} after {after})"
                if o.get("at") and start
                else ""
            )
            + f": {_escape(str(o['detail']))}"
            for o in outcomes
        ]
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": cut("*Actions*\n" + "\n".join(lines), SECTION_MAX)},
            }
        )
    annotations: Mapping[str, str] = incident.get("annotations", {})
    links = [
        f"<{annotations[key]}|{name}>"
        for key, name in LINKS
        if annotations.get(key, "").startswith(("http://", "https://"))
    ]
    if links:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": cut(" · ".join(links), SECTION_MAX)}]}
        )
    text = f"[{state}] {severity.upper()} {rule} on {where}: {said or fired_said}"
    return cut(text, TEXT_MAX), blocks[:BLOCKS_MAX]


def resolution(at: float, value: float | None, threshold: float | None, summary: str = "") -> str:
    """The resolution's reply: what the rule says at a resolution (its ``recovered`` or ``no_data``
    wording), or, for a notice queued before messages were worded per transition, the value."""
    if summary:
        return f"Resolved at {clock(at)}: {summary}"
    if value is None:
        return f"Resolved at {clock(at)}: no data to judge (the rule resolves on no data)"
    return f"Resolved at {clock(at)}: value {_number(value)}, threshold {_number(threshold)}"


def reply(text: str) -> tuple[str, list[dict[str, Any]]]:
    """A reply in an incident's thread: one section, the same text as its fallback."""
    short = cut(text, SECTION_MAX)
    return cut(text, TEXT_MAX), [{"type": "section", "text": {"type": "mrkdwn", "text": _escape(short)}}]


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
