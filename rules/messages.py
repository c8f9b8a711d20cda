"""What a series' transition says: one wording per kind of transition, each true of the value it
is said with.

A rule's single summary, written for a breach, used to be said at every transition: a series that
cleared said "acceptance 0.70 below 0.3". Here each event gets the wording its own value bears out:

- ``breach``: the series turns pending on a value that breaches the condition;
- ``still_breaching``: it fires, the breach having lasted ``for`` and ``consecutive``;
- ``recovered``: it clears (pending -> inactive) or resolves (firing -> resolved) on a value that
  no longer breaches;
- ``no_data``: it moves without a value (the ``no_data`` policy, a series gone for
  ``forget_after``, or the "signal missing" series closed because data is back).

The engine guarantees the premise: it moves a series to pending or firing only on a breach (or on
missing data under ``no_data: breach``), and clears or resolves it only on an ok value (or missing
data). A wording the rule leaves out gets a default, built from the rule's condition, that says no
more than that; a rule's old ``annotations.summary`` is its ``still_breaching``, and ``breach``
stands in for ``still_breaching`` too (a value that breaches still does when the series fires).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specguard.rules.durations import format_duration
from specguard.rules.schema import NoDataPolicy, Rule
from specguard.rules.templates import render


class Wording(StrEnum):
    BREACH = "breach"
    STILL_BREACHING = "still_breaching"
    RECOVERED = "recovered"
    NO_DATA = "no_data"

    @property
    def claims_breach(self) -> bool:
        """Whether this wording says the value breaches the condition."""
        return self in (Wording.BREACH, Wording.STILL_BREACHING)


# The states the engine moves a series into (``store.records.State``'s values).
_BREACHING = ("pending", "firing")
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def wording_of(kind: str, value: float | None) -> Wording:
    """The wording for a series entering state ``kind`` with ``value`` (None: no data)."""
    if value is None:
        return Wording.NO_DATA
    if kind == "pending":
        return Wording.BREACH
    if kind == "firing":
        return Wording.STILL_BREACHING
    return Wording.RECOVERED


@dataclass(frozen=True)
class Message:
    text: str
    wording: Wording
    default: bool  # the rule gave no wording of its own for this transition
    problem: str | None = None  # the rule's wording failed to render: the default was said instead


def where(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "all series"


def signal_name(rule: Rule) -> str:
    return rule.signal or ("alerts" if rule.alert_only else "expr")


def _hold(rule: Rule) -> str:
    """How long a breach must last to fire, in words; "" when it fires at once."""
    parts = []
    if rule.for_ > 0:
        parts.append(format_duration(rule.for_))
    if rule.consecutive > 1:
        parts.append(f"{rule.consecutive} evaluations in a row")
    return " and ".join(parts)


def change(rule: Rule, kind: str, value: float | None, labels: Mapping[str, str]) -> str:
    """What the transition means, in words (the ``{change}`` placeholder)."""
    hold = _hold(rule)
    wording = wording_of(kind, value)
    if wording is Wording.BREACH:
        return f"breaching; fires if it lasts {hold}" if hold else "breaching"
    if wording is Wording.STILL_BREACHING:
        return f"breaching for {hold}" if hold else "breaching"
    closed = "resolved" if kind == "resolved" else "cleared before it fired"
    if wording is Wording.RECOVERED:
        if kind == "resolved" and rule.keep_firing_for > 0:
            return f"ok for {format_duration(rule.keep_firing_for)}: resolved"
        return f"ok again: {closed}"
    # No value: what the missing data did.
    if kind in _BREACHING and rule.no_data is NoDataPolicy.BREACH:
        counted = "no data, counted as a breach (no_data: breach)"
        if kind == "pending":
            return f"{counted}; fires if it lasts {hold}" if hold else counted
        return f"{counted} for {hold}" if hold else counted
    if kind in _BREACHING:  # not a move the engine makes without a breach policy
        return f"no data, now {kind}"
    if rule.no_data is NoDataPolicy.OK:
        return f"no data, counted as ok (no_data: ok): {closed}"
    if rule.no_data is NoDataPolicy.BREACH and not labels:
        return f"reported again, so the missing-data breach is {closed}"
    return f"no data for longer than forget_after, the series is forgotten: {closed}"


def fields(
    rule: Rule, kind: str, previous: str, value: float | None, labels: Mapping[str, str]
) -> dict[str, Any]:
    """Every placeholder but ``value``, ``threshold`` and ``labels``, for this transition."""
    return {
        "rule": rule.name,
        "signal": signal_name(rule),
        "severity": rule.severity.value,
        "state": kind,
        "previous": previous,
        "condition": str(rule.test),
        "where": where(labels),
        "for": format_duration(rule.for_),
        "consecutive": rule.consecutive,
        "change": change(rule, kind, value, labels),
    }


def given(rule: Rule, wording: Wording) -> str | None:
    """The rule's own template for ``wording``, or None when the default is to be said."""
    messages = rule.messages
    if wording is Wording.BREACH:
        return messages.breach
    if wording is Wording.STILL_BREACHING:
        return messages.still_breaching or rule.annotations.get("summary") or messages.breach
    if wording is Wording.RECOVERED:
        return messages.recovered
    return messages.no_data


def _literal(text: str) -> str:
    """``text`` as template text that renders as itself."""
    return text.replace("{", "{{").replace("}", "}}")


def default(rule: Rule, wording: Wording, kind: str, labels: Mapping[str, str]) -> str:
    """The template said when the rule gives none for ``wording``: it claims no more than the
    transition's value shows."""
    op = rule.test.op if wording.claims_breach else _NEGATED[rule.test.op]
    if wording is Wording.NO_DATA:
        return "{signal} on {where}: {change}"
    if rule.alert is not None and rule.alert_only:
        matchers = _literal("{" + ", ".join(str(m) for m in rule.alert.matchers) + "}")
        if wording.claims_breach:
            return "{value:.4g} Alertmanager alert(s) " + matchers + " firing on {where}"
        return "no Alertmanager alert " + matchers + " firing on {where} any more: {change}"
    if rule.detect is not None:
        what = _literal(rule.detect.describe())
        return what + ": G = {value:.4g} " + op + " h = {threshold:.4g} on {where}: {change}"
    return "{signal} {value:.4g} " + _literal(op) + " {threshold:.4g} on {where}: {change}"


def message(
    rule: Rule,
    *,
    kind: str,
    previous: str,
    value: float | None,
    threshold: float | None,
    labels: Mapping[str, str],
) -> Message:
    """What a series of ``rule`` entering ``kind`` from ``previous`` says."""
    wording = wording_of(kind, value)
    known = fields(rule, kind, previous, value, labels)
    own = given(rule, wording)
    problem = None
    if own is not None:
        try:
            return Message(
                render(own, labels=labels, value=value, threshold=threshold, **known), wording, False
            )
        except ValueError as exc:
            problem = str(exc)
    text = render(
        default(rule, wording, kind, labels), labels=labels, value=value, threshold=threshold, **known
    )
    return Message(text, wording, True, problem)
