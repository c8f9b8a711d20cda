"""specguard's rules as a Prometheus alerting-rule file (``specguard export prometheus-rules``).

A site that already runs Prometheus and Alertmanager can let Prometheus evaluate the conditions
specguard evaluates, with the same PromQL (``Signal.promql``), thresholds, ``for`` and
``keep_firing_for``, so both fire and resolve at the same evaluations. What Prometheus has no
field for is converted where an exact equivalent exists and said in a comment where none does:

* ``consecutive: N`` fires on the Nth breaching evaluation in a row, which at a regular interval
  is ``for: (N - 1) x interval``; the exported ``for`` is the larger of that and the rule's own.
* A baseline-relative threshold is a number per series: specguard takes it from the most specific
  baseline entry that fits the series (model and instance, then model, then instance, then the
  default). Each entry becomes one Prometheus rule whose label matchers select exactly the series
  specguard would judge by that entry (``model_name!~"a|b"`` leaves out the models with entries of
  their own), with that entry's value written in: every series is judged by one rule, against the
  threshold specguard would use.
* ``estimated_speedup`` is computed as specguard computes it, ``mean_acceptance_length /
  (1 + k c)``, with c from the same baseline entries.
* ``no_data`` has no equivalent: in Prometheus a series without data drops out of the result, so a
  pending alert is cleared and a firing one resolves (after ``keep_firing_for``).

Annotations are Python format strings in specguard and Go templates in Prometheus; they are
translated (``{value:.2f}`` -> ``{{ printf "%.2f" $value }}``), and text that Go would read as a
template action is escaped. A Prometheus alert's annotations are its firing's, so the rule's firing
wording (``messages.still_breaching``, see ``rules.messages``) becomes its ``summary``.
"""

from __future__ import annotations

import math
import re
import string
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specguard.config.loading import Loaded, LoadedRule
from specguard.rules.durations import format_duration
from specguard.rules.matchers import Matcher
from specguard.rules.messages import Wording, change, given
from specguard.rules.schema import NoDataPolicy, Rule
from specguard.rules.signals import CATALOG, Kind, get_signal
from specguard.store.baseline import Baseline, Entry

COMMAND = "specguard export prometheus-rules"


# --- which series each baseline entry judges ------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """The series one exported rule judges: label matchers added to the rule's own."""

    matchers: tuple[Matcher, ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        """The labels every selected series has (its ``=`` matchers).

        Written as the rule's labels too: they change no alert (the series carry them already),
        and they keep the rules of one alert name apart, which promtool's duplicate-rule lint wants.
        """
        return {m.label: m.value for m in self.matchers if m.op == "="}

    def describe(self) -> str:
        return ", ".join(m.promql() for m in self.matchers) or "every series"


def _regex_of(values: Iterable[str]) -> str:
    """An RE2 alternation matching exactly ``values`` (Prometheus anchors it at both ends)."""
    return "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value) for value in sorted(set(values)))


def _not_in(label: str, values: Iterable[str]) -> tuple[Matcher, ...]:
    values = set(values)
    return (Matcher(label, "!~", _regex_of(values)),) if values else ()


def entry_scopes(entries: Sequence[Entry]) -> list[tuple[Entry, list[Scope]]]:
    """For each baseline entry, the series whose most specific fitting entry it is.

    Mirrors ``Baseline.entry_for``: model and instance beat model, model beats instance, instance
    beats the default. The scopes of all entries are disjoint. The default entry's share can need
    several selectors: a model+instance entry whose model has no entry of its own takes one
    instance of that model away from it, which one matcher per label cannot say.
    """
    models = {e.model for e in entries if e.model is not None and e.instance is None}
    instances = {e.instance for e in entries if e.instance is not None and e.model is None}
    pairs = {(e.model, e.instance) for e in entries if e.model is not None and e.instance is not None}
    out: list[tuple[Entry, list[Scope]]] = []
    for entry in entries:
        if entry.model is not None and entry.instance is not None:
            scopes = [
                Scope((Matcher("model_name", "=", entry.model), Matcher("instance", "=", entry.instance)))
            ]
        elif entry.model is not None:
            taken = {i for m, i in pairs if m == entry.model}
            scopes = [Scope((Matcher("model_name", "=", entry.model), *_not_in("instance", taken)))]
        elif entry.instance is not None:
            taken = models | {m for m, i in pairs if i == entry.instance}
            scopes = [Scope((Matcher("instance", "=", entry.instance), *_not_in("model_name", taken)))]
        else:
            # Pairs not already covered by their model's or their instance's entry.
            left = {(m, i) for m, i in pairs if m not in models and i not in instances}
            left_models = {m for m, _ in left}
            scopes = [Scope((*_not_in("model_name", models | left_models), *_not_in("instance", instances)))]
            for model in sorted(left_models):
                taken = instances | {i for m, i in left if m == model}
                scopes.append(Scope((Matcher("model_name", "=", model), *_not_in("instance", taken))))
        out.append((entry, scopes))
    return out


# --- annotation templates: Python format strings -> Go templates ----------------------------------

_SPEC = re.compile(
    r"^(?:(?P<fill>.)?(?P<align>[<>=^]))?(?P<sign>[-+ ])?z?(?P<alt>#)?(?P<zero>0)?(?P<width>\d+)?"
    r"(?P<grouping>[,_])?(?:\.(?P<precision>\d+))?(?P<type>[eEfFgGn%])?$"
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_FIELD = re.compile(r"^labels\[([^\]]*)\]$")


def _value_action(spec: str) -> str | None:
    """The Go action printing ``$value`` as Python's ``format(value, spec)`` would, or None."""
    if not spec:
        return "{{ $value }}"
    found = _SPEC.match(spec)
    if found is None or found["grouping"] or found["align"] in ("^", "="):
        return None
    if found["fill"] not in (None, " "):
        return None
    kind, precision = found["type"], found["precision"]
    if kind == "%":
        # Go templates have no arithmetic; Prometheus's own percentage helper multiplies by 100.
        plain = not (found["sign"] or found["alt"] or found["zero"] or found["width"] or found["align"])
        return "{{ $value | humanizePercentage }}" if plain else None
    flags = ("-" if found["align"] == "<" else "") + (found["sign"] or "").replace("-", "")
    flags += (found["alt"] or "") + (found["zero"] or "")
    if kind in (None, "n"):
        kind = "g"  # Python's default and locale formats are the general format
    verb = {"F": "f"}.get(kind, kind)
    # Python's precision defaults to 6 for every float format; Go's %g would print all digits.
    return f'{{{{ printf "%{flags}{found["width"] or ""}.{precision or 6}{verb}" $value }}}}'


def _go_text(text: str, action_follows: bool) -> str:
    """Literal ``text`` as Go template text: ``{{`` (and a ``{`` just before an action) would open
    an action, so they are printed by one."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("{{", i):
            out.append('{{ "{{" }}')
            i += 2
        elif text[i] == "{" and i == len(text) - 1 and action_follows:
            out.append('{{ "{" }}')
            i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def escape_go(text: str) -> str:
    """Text with no template actions of its own (a label value), safe in a Go template."""
    return _go_text(text, action_follows=False)


def go_template(
    template: str,
    *,
    threshold: float,
    rule: str,
    signal: str,
    severity: str,
    fixed: Mapping[str, Any] | None = None,
) -> tuple[str, list[str]]:
    """specguard's annotation ``template`` as a Prometheus (Go) template, and what could not be kept.

    ``threshold``, ``rule``, ``signal``, ``severity`` and ``state`` are known when the file is
    written (an alert Prometheus sends is firing), so they are rendered here with Python's own
    formatting, as are the ``fixed`` fields given (a firing's ``previous``, ``for``, ``change``...);
    ``value`` and ``labels`` become ``$value`` and ``$labels``.
    """
    fixed = {
        **(fixed or {}),
        "threshold": threshold,
        "rule": rule,
        "signal": signal,
        "severity": severity,
        "state": "firing",
    }
    pieces: list[tuple[bool, str]] = []  # (is an action, text)
    problems: list[str] = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        pieces.append((False, literal))
        if name is None:
            continue
        spec, suffix = spec or "", f"!{conversion}" if conversion else ""
        root = name.split("[", 1)[0].split(".", 1)[0]
        if root in fixed:
            pieces.append(
                (False, ("{" + name + suffix + (":" + spec if spec else "") + "}").format_map(fixed))
            )
            continue
        label = _LABEL_FIELD.match(name)
        if label is not None:
            key = label.group(1)
            ref = f"$labels.{key}" if _IDENTIFIER.match(key) else f"index $labels {_go_string(key)}"
            pieces.append((True, f"{{{{ {ref} }}}}"))
            if spec or conversion:
                problems.append(f"{{{name}{suffix}:{spec}}}: a label's format is not kept, it prints as is")
            continue
        action = _value_action(spec) if name == "value" and "{" not in spec else None
        if action is None:
            what = f"{{{name}{suffix}{':' + spec if spec else ''}}}"
            problems.append(f"{what} has no Go template equivalent here: it prints as {{{{ $value }}}}")
            action = "{{ $value }}"
        pieces.append((True, action))
    out: list[str] = []
    literal_run = ""
    for is_action, text in pieces:
        if is_action:
            out.append(_go_text(literal_run, action_follows=True) + text)
            literal_run = ""
        else:
            literal_run += text
    out.append(_go_text(literal_run, action_follows=False))
    return "".join(out), problems


def _go_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# --- one specguard rule -> Prometheus rules --------------------------------------------------------


class _Skip(Exception):
    """The rule cannot be exported; the message says why."""


@dataclass(frozen=True)
class _Judge:
    """One exported rule's share of the rule's series, and what they are compared with."""

    scope: Scope
    threshold: float
    cost: float | None = None  # c of estimated_speedup
    origin: tuple[str, ...] = ()  # comment lines: where the numbers come from


@dataclass
class _Exported:
    comments: list[str]
    body: dict[str, Any]


@dataclass
class RulesExport:
    """The rule file's text and what the operator should know about it."""

    text: str
    warnings: list[str] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)  # names of the specguard rules written
    alerting_rules: int = 0  # Prometheus rules written (a rule split by baseline entry counts each)
    skipped: dict[str, str] = field(default_factory=dict)  # rule name -> why it is not in the file


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


def _comment(text: str) -> str:
    return " ".join(text.split())


def _comment_lines(text: str, indent: str) -> list[str]:
    """``text`` as YAML comment lines of a readable width (a newline in it cannot end the comment)."""
    wrapped = textwrap.wrap(
        _comment(text), width=max(40, 100 - len(indent)), break_long_words=False, break_on_hyphens=False
    )
    return [f"{indent}# {wrapped[0]}", *(f"{indent}#   {line}" for line in wrapped[1:])] if wrapped else []


class _Converter:
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
            raise _Skip(f"{need} a baseline, and the config names none")
        entries = self._entries(item, baseline)
        if not entries:
            raise _Skip(
                f"no entry of the baseline ({_shown(self.loaded.config.baseline)}) can fit its series"
            )
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
            raise _Skip("; ".join(notes) or "no baseline entry gives its numbers")
        return judges, notes

    def _entries(self, item: LoadedRule, baseline: Baseline) -> list[Entry]:
        """The entries that can fit a series of the rule: one naming a model needs the model_name
        label in the rule's series, one naming an instance the instance label."""
        rule = item.rule
        if rule.expr is not None:
            # The labels of a raw expression's result are unknown here, and a selector cannot be
            # added to it: only a baseline of one default entry fits every series alike.
            if any(e.model is not None or e.instance is not None for e in baseline.entries):
                raise _Skip(
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

    def convert(self, item: LoadedRule, interval: float) -> tuple[list[_Exported], list[str]]:
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
        out: list[_Exported] = []
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
            out.append(_Exported([*(common if not out else []), *judge.origin], body))
        return out, warnings


def _skip_reason(rule: Rule) -> str | None:
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


def export_rules(loaded: Loaded, version: str) -> RulesExport:
    """The alerting-rule file for every enabled rule of ``loaded`` with a signal or an expr."""
    converter = _Converter(loaded)
    result = RulesExport(text="")
    groups: dict[float, list[_Exported]] = {}
    for item in loaded.rules:
        rule = item.rule
        reason = _skip_reason(rule)
        if reason is not None:
            result.skipped[rule.name] = reason
            continue
        interval = rule.interval or loaded.config.interval
        try:
            exported, warnings = converter.convert(item, interval)
        except _Skip as exc:
            result.skipped[rule.name] = str(exc)
            result.warnings.append(f"{rule.name}: not exported: {exc}")
            continue
        result.exported.append(rule.name)
        result.alerting_rules += len(exported)
        result.warnings.extend(warnings)
        groups.setdefault(interval, []).extend(exported)
    result.text = _render(loaded, version, groups, result.skipped)
    return result


_HEADER = (
    "Prometheus alerting rules generated by `{command}` from {source} (specguard {version}). "
    "Regenerate after changing the rules or the baseline instead of editing this file.",
    "Load it with `rule_files: [this file]` in prometheus.yml; check it with `promtool check rules`.",
    "Prometheus evaluates these rules itself, with the PromQL specguard's Prometheus source runs: they "
    "fire and resolve at the same evaluations as specguard's, with these differences: a series without "
    "data drops out (a pending alert is cleared, a firing one resolves after keep_firing_for), where "
    "specguard's `no_data: keep` holds its state; rate() extrapolates to the window's edges, which "
    "changes rates a little but not ratios or quantiles.",
)


def _render(
    loaded: Loaded, version: str, groups: dict[float, list[_Exported]], skipped: dict[str, str]
) -> str:
    source = (
        loaded.config_file
        if loaded.config_file and loaded.config_file != "<defaults>"
        else "built-in defaults"
    )
    paragraphs = [p.format(command=COMMAND, source=source, version=version) for p in _HEADER]
    paragraphs += [f"Not exported: {name}: {why}" for name, why in skipped.items()]
    lines = [line for paragraph in paragraphs for line in _comment_lines(paragraph, "")]
    lines.append("groups:" if groups else "groups: []")
    for interval in sorted(groups):
        every = format_duration(interval)
        lines.append(f"  - name: specguard-{every}")
        lines.append(f"    interval: {every}")
        lines.append("    rules:")
        for exported in groups[interval]:
            for comment in exported.comments:
                lines.extend(_comment_lines(comment, "      "))
            dumped = yaml.safe_dump([exported.body], sort_keys=False, width=2**31 - 1, allow_unicode=True)
            lines.extend(f"      {line}" for line in dumped.splitlines())
    return "\n".join(lines) + "\n"
