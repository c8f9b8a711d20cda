"""Message and annotation templates: Python format strings over the value, threshold and labels.

``"acceptance {value:.2f} < {threshold} on {labels[instance]}"``. Templates are checked when rules
load, so a typo is a load error, not a broken notification at 3 a.m. Which fields mean what, per
transition, is ``rules.messages``'s; ``docs/messages.md`` is the operator's reference.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

FIELDS = (
    "value",
    "threshold",
    "labels",
    "rule",
    "signal",
    "severity",
    "state",
    "previous",
    "condition",
    "where",
    "for",
    "consecutive",
    "change",
)

# What a template is tried with when it loads: every field, with a value of its kind.
SAMPLE: dict[str, Any] = {
    "threshold": 0.5,
    "rule": "r",
    "signal": "s",
    "severity": "info",
    "state": "firing",
    "previous": "pending",
    "condition": "< 0.5",
    "where": "instance=a",
    "for": "5m",
    "consecutive": 3,
    "change": "breaching for 5m",
}


class _Labels(dict[str, str]):
    """Missing labels render as an empty string rather than failing."""

    def __missing__(self, key: str) -> str:
        return ""


def fields_of(template: str) -> list[str]:
    """The fields ``template`` names as written (``labels[instance]``), in order. Raises
    ValueError for bad syntax."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"invalid template {template!r}: {exc}") from None
    return [field for _, field, _, _ in parsed if field is not None]


def root_of(field: str) -> str:
    """The placeholder a field reads: ``labels`` for ``labels[instance]``."""
    return field.split("[", 1)[0].split(".", 1)[0]


def check_template(template: str) -> None:
    """Raise ValueError if ``template`` uses an unknown field or bad syntax."""
    for field in fields_of(template):
        if root_of(field) not in FIELDS:
            raise ValueError(
                f"unknown template field {{{field}}}; available: {', '.join(FIELDS)} "
                "(labels as {labels[name]})"
            )
    render(template, value=0.5, labels={}, **SAMPLE)


def render(template: str, *, labels: Mapping[str, str], value: float | None, **fields: Any) -> str:
    """Fill a template. A value that is missing or does not fit a number format renders as '-'."""
    values: dict[str, Any] = {**fields, "labels": _Labels(labels), "value": value}
    try:
        return template.format_map(values)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        # retry with the missing numbers blanked, keeping the ones that are there
        if value is None:
            values["value"] = _Blank()
        if fields.get("threshold") is None:
            values["threshold"] = _Blank()
        try:
            return template.format_map(values)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise ValueError(f"cannot render template {template!r}: {exc}") from None


class _Blank:
    def __format__(self, spec: str) -> str:
        return "-"
