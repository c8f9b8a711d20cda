"""One specguard rule as Prometheus alerting rules: its PromQL and threshold per baseline entry,
``for`` from ``for`` and ``consecutive``, labels, annotations as Go templates and comments saying
where the numbers come from; and the rules that cannot be exported, with the reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specguard.config.loading import Loaded, LoadedRule
from specguard.export.go_templates import escape_go, go_template
from specguard.export.scopes import Scope, entry_scopes
from specguard.rules.durations import format_duration
from specguard.rules.messages import Wording, change, given
from specguard.rules.schema import NoDataPolicy, Rule
from specguard.rules.signals import CATALOG, Kind, get_signal
from specguard.store.baseline import Baseline, Entry


class Skip(Exception):
    """The rule cannot be exported; the message says why."""


@dataclass(frozen=True)
class _Judge:
    """One exported rule's share of the rule's series, and what they are compared with."""

    scope: Scope
    threshold: float
    cost: float | None = None  # c of estimated_speedup
    origin: tuple[str, ...] = ()  # comment lines: where the numbers come from


@dataclass
class Exported:
    """One Prometheus rule: its body, and the comment lines written above it."""

    comments: list[str]
    body: dict[str, Any]


def _number(value: float) -> str:
    """A threshold as PromQL reads it back to the same float (repr is the shortest exact form)."""
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(float(value)).removesuffix(".0") if value == int(value) else repr(float(value))


def _shown(path: Path | None) -> str:
    """A path as the operator would type it from here: relative when it lies below the working
    directory (the config's own label is what they gave on the command line)."""
    if path is None:
        return "-"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class Converter:
    """Turns the rules of one loaded config into Prometheus rules, against its baseline."""

    def __init__(self, loaded: Loaded) -> None:
        self.loaded = loaded
        self.baseline: Baseline | None = loaded.baseline

    def judges(self, item: LoadedRule) -> tuple[list[_Judge], list[str]]:
        """Who is compared with what, and notes on series no exported rule judges."""
        rule = item.rule
        condition = rule.test
        speedup = rule.signal is not None and get_signal(rule.signal).kind is Kind.SPEEDUP
        if condition.baseline_signal is None and not speedup:
            assert condition.constant is not None
            return [_Judge(Scope(), condition.constant)], []
        baseline = self.baseline
        if baseline is None:
            need = "estimated_speedup takes the draft's cost from" if speedup else f"{condition.text!r} needs"
            raise Skip(f"{need} a baseline, and the config names none")
        entries = self._entries(item, baseline)
        if not entries:
            raise Skip(f"no entry of the baseline ({_shown(self.loaded.config.baseline)}) can fit its series")
        judges: list[_Judge] = []
        notes: list[str] = []
        where = f"{_shown(self.loaded.config.baseline)}, measured_at {baseline.data.measured_at.isoformat()}"
        for entry, scopes in entry_scopes(entries):
            origin: list[str] = []
            reason: str | None = None
            threshold = condition.constant
            if condition.baseline_signal is not None:
                name = condition.baseline_signal
                value = entry.signals.get(name)
                if value is None:
                    reason = f"{entry.describe()} has no value for {name!r}"
                else:
                    threshold = condition.factor * value
                    origin.append(
                        f"threshold {_number(threshold)} = {_number(condition.factor)} x {name} "
                        f"{_number(value)} from {entry.describe()} ({where})"
                    )
            cost: float | None = None
            if speedup and reason is None:
                found = entry.speculative.cost() if entry.speculative is not None else None
                if not isinstance(found, float | int):
                    reason = found or f"{entry.describe()} says nothing of the speculative method"
                else:
                    cost = float(found)
                    assert entry.speculative is not None
                    how = (
                        "speculative.draft_cost"
                        if entry.speculative.draft_cost is not None
                        else f"the default for method {entry.speculative.method}"
                    )
                    origin.append(f"c = {_number(cost)} ({how}) from {entry.describe()} ({where})")
            for scope in scopes:
                if reason is not None:
                    notes.append(
                        f"series {scope.describe()} are judged by no rule: {reason} (specguard reports "
                        "an error for them)"
                    )
                    continue
                assert threshold is not None
                judges.append(
                    _Judge(
                        scope,
                        threshold,
                        cost,
                        (*origin, f"series: {scope.describe()}") if scope.matchers else tuple(origin),
                    )
                )
        if not judges:
            raise Skip("; ".join(notes) or "no baseline entry gives its numbers")
        return judges, notes

    def _entries(self, item: LoadedRule, baseline: Baseline) -> list[Entry]:
        """The entries that can fit a series of the rule: one naming a model needs the model_name
        label in the rule's series, one naming an instance the instance label."""
        rule = item.rule
        if rule.expr is not None:
            # The labels of a raw expression's result are unknown here, and a selector cannot be
            # added to it: only a baseline of one default entry fits every series alike.
            if any(e.model is not None or e.instance is not None for e in baseline.entries):
                raise Skip(
                    "its threshold depends on the baseline entry of each series, and the series of a "
                    "raw PromQL `expr` cannot be split by model and instance"
                )
            return list(baseline.entries)
        assert rule.signal is not None
        signal = get_signal(rule.signal)
        parts = [CATALOG[name] for name in signal.inputs] or [signal]
        groups = set(parts[0].groups(item.group_by, item.keep_intrinsic))
        return [
            e
            for e in baseline.entries
            if (e.model is None or "model_name" in groups) and (e.instance is None or "instance" in groups)
        ]

    def expr(self, item: LoadedRule, judge: _Judge) -> str:
        rule = item.rule
        op = rule.test.op
        if rule.expr is not None:
            return f"({rule.expr.strip()}) {op} {_number(judge.threshold)}"
        assert rule.signal is not None
        signal = get_signal(rule.signal)
        match = (*item.matchers, *judge.scope.matchers)

        def promql(name: str) -> str:
            return CATALOG[name].promql(rule.window, item.group_by, match, item.keep_intrinsic)

        if signal.kind is Kind.SPEEDUP:
            assert judge.cost is not None
            length, positions = (promql(name) for name in signal.inputs)
            return f"({length}) / (1 + ({positions}) * {_number(judge.cost)}) {op} {_number(judge.threshold)}"
        return f"({promql(signal.name)}) {op} {_number(judge.threshold)}"

    def convert(self, item: LoadedRule, interval: float) -> tuple[list[Exported], list[str]]:
        """The Prometheus rules for ``item``, and warnings for the operator."""
        rule = item.rule
        judges, notes = self.judges(item)
        warnings = [f"{rule.name}: {note}" for note in notes]
        common = [f"{rule.name}: {rule.description}"] if rule.description else []
        common += notes
        hold = rule.for_
        if rule.consecutive > 1:
            needed = (rule.consecutive - 1) * interval
            hold = max(hold, needed)
            common.append(
                f"consecutive: {rule.consecutive} at a {format_duration(interval)} interval fires on the "
                f"evaluation {format_duration(needed)} after the first breach: for is "
                f"max(for {format_duration(rule.for_)}, {format_duration(needed)}) = {format_duration(hold)}"
            )
        if rule.no_data is not NoDataPolicy.KEEP:
            if rule.no_data is NoDataPolicy.BREACH:
                common.append(
                    "no_data: breach has no Prometheus equivalent: here a series without data drops out "
                    "and never fires (add an absent() rule for that)"
                )
                warnings.append(
                    f"{rule.name}: no_data: breach has no Prometheus equivalent: missing data will not fire"
                )
            else:
                common.append(
                    "no_data: ok has no field in Prometheus: a series without data drops out of the result, "
                    "which resolves it as ok does (after keep_firing_for)"
                )
        if rule.shadow:
            common.append("shadow in specguard (it never acts there): Prometheus will send this alert")
            warnings.append(f"{rule.name}: a shadow rule in specguard: Prometheus will send its alerts")
        out: list[Exported] = []
        signal_text = rule.signal or "expr"
        templates = dict(rule.annotations)
        firing_message = given(rule, Wording.STILL_BREACHING)
        if firing_message is not None:
            templates["summary"] = firing_message
        firing = {
            "previous": "pending",
            "condition": str(rule.test),
            "for": format_duration(rule.for_),
            "consecutive": rule.consecutive,
            "change": change(rule, "firing", 0.0, {}),
        }
        for judge in judges:
            body: dict[str, Any] = {"alert": rule.name, "expr": self.expr(item, judge)}
            if hold > 0:
                body["for"] = format_duration(hold)
            if rule.keep_firing_for > 0:
                body["keep_firing_for"] = format_duration(rule.keep_firing_for)
            labels = {**rule.labels, "severity": rule.severity.value, **judge.scope.labels}
            body["labels"] = {key: escape_go(value) for key, value in labels.items()}
            annotations: dict[str, str] = {}
            for key, template in templates.items():
                text, problems = go_template(
                    template,
                    threshold=judge.threshold,
                    rule=rule.name,
                    signal=signal_text,
                    severity=rule.severity.value,
                    fixed=firing,
                )
                annotations[key] = text
                for problem in problems:
                    warning = f"{rule.name}: annotation {key}: {problem}"
                    if warning not in warnings:
                        warnings.append(warning)
            if annotations:
                body["annotations"] = annotations
            # What holds for the whole rule is said once, above its first Prometheus rule.
            out.append(Exported([*(common if not out else []), *judge.origin], body))
        return out, warnings


def skip_reason(rule: Rule) -> str | None:
    if not rule.enabled:
        return "disabled"
    if rule.alert_only:
        return "an alert rule: its input is Alertmanager's alerts, it has no query of its own"
    if rule.detect is not None:
        return (
            "a sequential detector: its CUSUM carries evidence from one evaluation to the next, "
            "which a Prometheus alerting rule cannot keep; specguard evaluates it"
        )
    return None
