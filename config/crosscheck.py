"""Checks across the config's files: what a rule names must exist (its actions, the source and the
baseline it reads), rule names are unique, and what the config declares is used.

They run on every rule, also on one left out for errors of its own (with the fields in error set
aside), and on a config with keys in error (a check that depends on such a key is skipped rather
than guessed): ``specguard check`` then lists every problem in one pass, not one more after each fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from specguard.actions.feature_flag import FeatureFlagAction
from specguard.common.names import did_you_mean
from specguard.common.yamlfile import LineDict, Problem, line_of
from specguard.config.routing import is_loopback, split_host_port
from specguard.rules.schema import Rule
from specguard.rules.signals import CATALOG

if TYPE_CHECKING:
    from specguard.config.loading import Loaded, LoadedRule

_ACTION_NAMES: TypeAdapter[tuple[str, ...]] = TypeAdapter(tuple[str, ...])


@dataclass(frozen=True)
class RuleRef:
    """A rule as the cross-checks see it: where it is, its name and actions, and the rule itself
    when it validates (for a rule left out, once its fields in error are set aside)."""

    file: str
    line: int | None
    index: int
    key_lines: Mapping[str, int] = field(default_factory=dict)
    name: str | None = None
    actions: tuple[str, ...] = ()
    rule: Rule | None = None
    loaded: bool = True  # among the rules that run; False: left out for its own errors
    mentioned: tuple[str, ...] = ()  # names in an `actions` in error (`actions: fallback`): in use


def ref_of(item: LoadedRule) -> RuleRef:
    return RuleRef(
        item.file, item.line, item.index, item.key_lines, item.name, item.rule.actions, item.rule, True
    )


def left_out(raw: Any, error: ValidationError, file: str, line: int | None, index: int) -> RuleRef:
    """A rule that failed validation, with what can still be checked of it."""
    if not isinstance(raw, dict):
        return RuleRef(file, line, index)
    lines = raw.key_lines if isinstance(raw, LineDict) else {}
    in_error = {str(item["loc"][0]) for item in error.errors() if item["loc"]}
    given = raw.get("actions")
    mentioned = tuple(v for v in (given if isinstance(given, list) else [given]) if isinstance(v, str))
    try:
        rule = Rule.model_validate({k: v for k, v in raw.items() if k not in in_error})
    except ValidationError:
        rule = None
    actions: tuple[str, ...] = ()
    if "actions" not in in_error:
        try:
            actions = _ACTION_NAMES.validate_python(raw.get("actions", ("log",)))
        except ValidationError:
            actions = ()
    if rule is not None:
        return RuleRef(file, line, index, lines, rule.name, actions, rule, False, mentioned)
    name = raw.get("name") if "name" not in in_error and isinstance(raw.get("name"), str) else None
    return RuleRef(file, line, index, lines, name, actions, None, False, mentioned)


def _problem(ref: RuleRef, key: str, message: str, warning: bool = False) -> Problem:
    line = ref.key_lines.get(key, ref.line)
    return Problem(ref.file, line, f"rules[{ref.index}].{key}", message, warning)


def cross_check(loaded: Loaded, refs: Sequence[RuleRef], data: Any, every_rule: bool) -> None:
    """Append the problems across files to ``loaded.problems``. ``refs``: every rule read, in the
    order of its files; ``data``: the config file's YAML (for lines); ``every_rule``: ``refs`` holds
    every rule of the config (no file missing or unreadable, none named on the command line), so an
    action none of them names is unused."""
    seen: dict[str, RuleRef] = {}
    for ref in refs:
        if ref.name is not None:
            first = seen.setdefault(ref.name, ref)
            if first is not ref:
                where = f"{first.file}:{first.line}"
                loaded.problems.append(
                    _problem(ref, "name", f"duplicate rule name {ref.name!r} (first at {where})")
                )
        _check_actions(loaded, ref)
        if ref.rule is not None:
            _check_rule(loaded, ref, ref.rule)
    if every_rule:
        _check_unused_actions(loaded, refs, data)
    _check_router_flags(loaded, data)


def _check_actions(loaded: Loaded, ref: RuleRef) -> None:
    if "actions" in loaded.invalid_keys:  # what is declared is unknown: its own error is listed
        return
    for action in ref.actions:
        if action not in loaded.actions and action not in loaded.unbuilt_actions:
            known = ", ".join(sorted(loaded.actions)) or "none"
            hint = did_you_mean(action, loaded.actions)
            message = (
                f"unknown action {action!r}{hint} (configured: {known})"
                if hint
                else f"unknown action {action!r}; configured: {known}"
            )
            loaded.problems.append(_problem(ref, "actions", message))


def _check_rule(loaded: Loaded, ref: RuleRef, rule: Rule) -> None:
    kind = loaded.config.sources.kind
    if rule.expr is not None:
        if kind != "prometheus" and "sources" not in loaded.invalid_keys:
            message = "raw PromQL needs the prometheus source; this config scrapes /metrics"
            loaded.problems.append(_problem(ref, "expr", message))
        if rule.group_by is not None:
            loaded.problems.append(
                _problem(ref, "group_by", "group_by applies to signals; write `sum by` in expr")
            )
        if rule.match:
            loaded.problems.append(
                _problem(ref, "match", "match applies to signals; write the selector in expr")
            )
    # What a rule needs of the baseline: unknown while the config's `baseline` key is in error.
    baseline_known = "baseline" not in loaded.invalid_keys
    baseline_signal = rule.test.baseline_signal
    if baseline_signal is not None:
        if baseline_signal not in CATALOG:
            loaded.problems.append(_problem(ref, "condition", f"baseline.{baseline_signal}: no such signal"))
        elif loaded.baseline is None and loaded.config.baseline is None and baseline_known and ref.loaded:
            message = (
                "refers to the baseline, but no baseline file is configured: the rule reports an error "
                "until one is"
            )
            loaded.problems.append(_problem(ref, "condition", message, warning=True))
        elif loaded.baseline is not None and baseline_signal not in loaded.baseline.signals_named():
            # A warning, as without a baseline file: the rule reports an error until the file has
            # the value (a file from an older `specguard bench` lacks the newer figures).
            message = (
                f"the baseline has no value for {baseline_signal!r}: the rule reports an error until it "
                "has one (`specguard bench --write-baseline` writes it)"
            )
            loaded.problems.append(_problem(ref, "condition", message, warning=True))
    if rule.signal == "estimated_speedup" and baseline_known and ref.loaded:
        if loaded.config.baseline is None:
            message = (
                "estimated_speedup needs the draft's cost from a baseline file (speculative.method or "
                "draft_cost): the rule reports an error until one is configured"
            )
            loaded.problems.append(_problem(ref, "signal", message, warning=True))
        elif rule.enabled:
            _check_draft_cost(loaded, ref)


def _check_draft_cost(loaded: Loaded, ref: RuleRef) -> None:
    """Each baseline entry the speedup may read must give the draft's cost (or a method that has a
    default one); a series served by one that does not is an error at every evaluation."""
    if loaded.baseline is None:
        return
    lacking = []
    for entry in loaded.baseline.entries:
        who = entry.describe()
        speculative = entry.speculative
        if speculative is None:
            lacking.append(f"{who} gives no speculative.method or draft_cost")
        elif not isinstance(speculative.cost(), float):
            method = (
                f"method {speculative.method!r}, which has no default cost,"
                if speculative.method
                else "no method"
            )
            lacking.append(f"{who} gives {method} and no draft_cost")
    if not lacking:
        return
    serves = "the series that entry serves" if len(lacking) == 1 else "the series those entries serve"
    message = (
        f"estimated_speedup needs the draft's cost per step, and {'; '.join(lacking)}: the rule reports "
        f"an error for {serves} until {loaded.config.baseline} gives one (speculative.method such as "
        "eagle3 or ngram, or speculative.draft_cost)"
    )
    loaded.problems.append(_problem(ref, "signal", message, warning=True))


def _check_unused_actions(loaded: Loaded, refs: Sequence[RuleRef], data: Any) -> None:
    """An action the config declares that no rule names never runs: most often a rule's `actions`
    spells it differently. Builtin actions (``log``) are always there and never reported."""
    if "actions" in loaded.invalid_keys:
        return
    used = {action for ref in refs for action in (*ref.actions, *ref.mentioned)}
    for built in loaded.actions.values():
        used.update(built.uses())
    for name in loaded.unbuilt_actions:
        # An action that could not be built may still name another (a drain's flag): any of its
        # values that names an action counts as a use, so the fix of its error reveals no warning.
        raw = loaded.config.actions.get(name)
        if isinstance(raw, dict):
            used.update(v for v in raw.values() if isinstance(v, str))
    if loaded.config.report.slack is not None:
        used.add(loaded.config.report.slack)
    for name in loaded.config.actions:
        if name in used:
            continue
        action = loaded.actions.get(name)
        if action is not None and action.type == "vllm_restart":
            message = (
                "no rule lists this action in its `actions`: it changes num_speculative_tokens only when "
                "stepped by hand (`specguard ladder`)"
            )
        else:
            message = (
                "no rule lists this action in its `actions`, so it never runs (a rule's `actions` misspelt?)"
            )
        where = line_of(data, ("actions", name))
        file = loaded.config_file or "<defaults>"
        loaded.problems.append(Problem(file, where, f"actions.{name}", message, warning=True))


def _same_address(admin_url: tuple[str, int], admin_listen: tuple[str, int]) -> bool:
    """Whether the action's admin_url reaches the router's admin_listen (``localhost`` reaches a
    loopback address, a loopback address ``localhost``)."""
    (host, port), (listen_host, listen_port) = admin_url, admin_listen
    if port != listen_port:
        return False
    if host == listen_host:
        return True
    return "localhost" in (host, listen_host) and is_loopback(host) and is_loopback(listen_host)


def _check_router_flags(loaded: Loaded, data: Any) -> None:
    """A ``feature_flag`` with an ``nginx`` backend must name the router the ``routing:`` section
    renders: its ``admin_listen`` and its ``flag_file``. One of the two matching and the other not
    is a mistake (the router would lose the flag on a restart, or never be told): an error. Neither
    matching may be another router, rendered from another config: a warning."""
    routing = loaded.config.routing
    if routing is None or "routing" in loaded.invalid_keys:
        return
    listen = split_host_port(routing.admin_listen)
    file = loaded.config_file or "<defaults>"
    for name, action in sorted(loaded.actions.items()):
        if not isinstance(action, FeatureFlagAction) or action.flag.nginx is None:
            continue
        nginx = action.flag.nginx
        url_ok = _same_address(nginx.hostport(), listen)
        file_ok = nginx.flag_file == routing.flag_file
        if url_ok and file_ok:
            continue
        where = ("actions", name, "nginx")
        if not url_ok and not file_ok:
            message = (
                f"names neither the routing section's admin_listen {routing.admin_listen} nor its flag_file "
                f"{routing.flag_file}: fine for a router rendered from another config, otherwise give "
                f"admin_url: http://{routing.admin_listen} and flag_file: {routing.flag_file}"
            )
            line = line_of(data, where)
            loaded.problems.append(Problem(file, line, f"actions.{name}.nginx", message, warning=True))
        elif not url_ok:
            message = (
                f"{nginx.admin_url} is not the routing section's admin_listen {routing.admin_listen}, whose "
                f"flag_file this action writes: give admin_url: http://{routing.admin_listen}"
            )
            line = line_of(data, (*where, "admin_url"))
            loaded.problems.append(Problem(file, line, f"actions.{name}.nginx.admin_url", message))
        else:
            message = (
                f"{nginx.flag_file} is not the routing section's flag_file {routing.flag_file}: nginx would "
                f"read the other one when it starts, and forget the fallback; give flag_file: {routing.flag_file}"
            )
            line = line_of(data, (*where, "flag_file"))
            loaded.problems.append(Problem(file, line, f"actions.{name}.nginx.flag_file", message))
