"""Load and cross-check the config, its rule files, its baseline and its action instances.

Everything an operator can get wrong is collected as a Problem (``file:line: field: message``), so
``specguard check`` can list them all at once and ``specguard run`` can refuse a bad config (or a
SIGHUP can keep the old one) with the reason.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from specguard.actions import ACTION_TYPES, BUILTIN_INSTANCES, Action
from specguard.common.secrets import SecretRef
from specguard.common.yamlfile import FileProblems, LineDict, Problem, line_of, load_yaml, validation_problems
from specguard.config.crosscheck import RuleRef, cross_check, left_out, ref_of
from specguard.config.schema import CREDENTIAL_NAME, MOVED_KEYS, Config
from specguard.rules.matchers import Matcher
from specguard.rules.schema import Rule, RuleFile
from specguard.rules.signals import DEFAULT_GROUP_BY
from specguard.store.baseline import Baseline, parse_baseline

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class LoadedRule:
    rule: Rule
    file: str
    line: int | None
    index: int = 0  # position in its file's `rules:` list
    key_lines: Mapping[str, int] = field(default_factory=dict)  # line of each key, for messages

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def group_by(self) -> tuple[str, ...]:
        if self.rule.group_by is not None:
            return self.rule.group_by
        return DEFAULT_GROUP_BY if self.rule.signal else ()

    def every(self, default: float) -> float:
        """How often the rule is evaluated: its own ``interval``, else ``default`` (the config's)."""
        return self.rule.interval or default

    @property
    def keep_intrinsic(self) -> bool:
        """A signal's own labels (``position``) stay unless the rule's ``group_by`` leaves them out."""
        return self.rule.group_by is None

    @property
    def matchers(self) -> tuple[Matcher, ...]:
        return self.rule.matchers


@dataclass
class Loaded:
    config: Config
    config_file: str | None
    rules: list[LoadedRule] = field(default_factory=list)
    baseline: Baseline | None = None
    actions: dict[str, Action] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    webhook_token: str | None = None  # the bearer token the webhook wants, read once here
    prometheus_token: str | None = None  # the bearer token sent to Prometheus, read once here
    # Top-level config keys in error: left at their defaults so the rest is checked, and the checks
    # that depend on them skipped (their own errors are listed).
    invalid_keys: frozenset[str] = frozenset()
    # Actions the config declares that could not be built (their errors are listed).
    unbuilt_actions: frozenset[str] = frozenset()

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if not p.warning]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.warning]

    @property
    def ok(self) -> bool:
        return not self.errors

    def enabled_rules(self) -> list[LoadedRule]:
        return [r for r in self.rules if r.rule.enabled]


def builtin_pack(name: str) -> Path:
    return Path(str(resources.files("specguard.rules") / "packs" / f"{name}.yaml"))


def builtin_packs() -> list[str]:
    return sorted(
        p.name.removesuffix(".yaml")
        for p in (resources.files("specguard.rules") / "packs").iterdir()
        if p.name.endswith(".yaml")
    )


def load(
    config_file: Path | None,
    rule_files: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> Loaded:
    """Load everything. Never raises for bad input: look at ``Loaded.problems``."""
    overrides = dict(overrides or {})
    base_dir = config_file.parent if config_file else Path.cwd()
    data: Any = LineDict()
    label = str(config_file) if config_file else "<defaults>"
    if config_file is not None:
        try:
            data = load_yaml(config_file)
        except FileProblems as exc:
            return Loaded(Config(), label, problems=exc.problems)
        if data is None:
            data = LineDict()
        if not isinstance(data, dict):
            problem = Problem(label, line_of(data, ()), "", "the config must be a mapping of keys")
            return Loaded(Config(), label, problems=[problem])
    moved = [
        Problem(label, line_of(data, (key,)), key, f"`{key}` is now `{new}`")
        for key, new in MOVED_KEYS.items()
        if key in data
    ]
    raw = _merged({k: v for k, v in data.items() if k not in MOVED_KEYS}, overrides)
    invalid: frozenset[str] = frozenset()
    try:
        # Paths inside secret references ({file: ...}) are relative to the config's directory.
        config = Config.model_validate(raw, context={"base": base_dir})
    except ValidationError as exc:
        moved = [*moved, *validation_problems(label, data, exc)]
        salvaged = _without_keys_in_error(raw, exc, base_dir)
        if salvaged is None:
            return Loaded(Config(), label, problems=moved)
        config, invalid = salvaged
    config = _resolve_paths(config, base_dir)
    loaded = Loaded(config, label, problems=moved, invalid_keys=invalid)
    loaded.actions = _load_actions(config, data, label, loaded.problems, base_dir)
    loaded.unbuilt_actions = frozenset(config.actions) - frozenset(loaded.actions)
    loaded.baseline = _load_baseline(config, data, label, loaded.problems)
    _check_report_slack(loaded, data)
    _check_report_history(loaded, data)
    _check_coordination(loaded, data)
    patterns = list(rule_files) or ([] if "rules" in invalid else list(config.rules))
    # Files named on the command line are relative to where the command runs, like promtool's;
    # files named in the config are relative to the config.
    rules_base = Path.cwd() if rule_files else base_dir
    before = len(loaded.errors)
    files = _expand(patterns, rules_base, data, label, loaded.problems, explicit=bool(rule_files))
    every_rule = not rule_files and "rules" not in invalid and len(loaded.errors) == before
    refs: list[RuleRef] = []
    for file_label, path in files:
        found = _load_rule_file(path, file_label, loaded.problems, refs)
        every_rule = every_rule and found is not None
        loaded.rules.extend(found or ())
    cross_check(loaded, refs, data, every_rule)
    loaded.prometheus_token = _prometheus_token(config, data, label, loaded.problems)
    loaded.webhook_token = _webhook_token(config, data, label, loaded.problems)
    return loaded


def _without_keys_in_error(
    raw: Mapping[str, Any], error: ValidationError, base: Path
) -> tuple[Config, frozenset[str]] | None:
    """The config with its top-level keys in error left at their defaults, and those keys; None when
    an error is not under a key (then nothing more can be checked)."""
    locations = [item["loc"] for item in error.errors()]
    if not all(locations):
        return None
    keys = frozenset(str(loc[0]) for loc in locations)
    try:
        config = Config.model_validate(
            {k: v for k, v in raw.items() if k not in keys}, context={"base": base}
        )
    except ValidationError:
        return None
    return config, keys


def _merged(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    raw = dict(data)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "server" and isinstance(value, Mapping):  # merged key by key into the file's
            given = raw.get(key)
            if given is None or isinstance(given, Mapping):  # anything else stays, to be refused
                raw[key] = {**(given or {}), **{k: v for k, v in value.items() if v is not None}}
        else:
            raw[key] = value
    return raw


def _resolve_paths(config: Config, base: Path) -> Config:
    def resolve(path: Path | None) -> Path | None:
        return None if path is None else (path if path.is_absolute() else base / path).expanduser()

    update: dict[str, Any] = {
        "baseline": resolve(config.baseline),
        "serving": resolve(config.serving),
        "state_dir": resolve(config.state_dir),
        "server": config.server.model_copy(
            update={"webhook_token_file": resolve(config.server.webhook_token_file)}
        ),
        "report": config.report.model_copy(update={"out_dir": resolve(config.report.out_dir)}),
    }
    prometheus = config.sources.prometheus
    if prometheus is not None and prometheus.bearer_token_file is not None:
        sources = config.sources.model_copy(
            update={
                "prometheus": prometheus.model_copy(
                    update={"bearer_token_file": resolve(prometheus.bearer_token_file)}
                )
            }
        )
        update["sources"] = sources
    return config.model_copy(update=update)


def _expand(
    patterns: Sequence[str],
    base: Path,
    data: Any,
    label: str,
    problems: list[Problem],
    explicit: bool,
) -> list[tuple[str, Path]]:
    """(label for messages, path) of each rule file; shipped packs are labelled builtin:<name>."""
    files: list[tuple[str, Path]] = []
    for index, pattern in enumerate(patterns):
        where = (label, None, "") if explicit else (label, line_of(data, ("rules", index)), f"rules[{index}]")
        if pattern.startswith(BUILTIN_PREFIX):
            name = pattern.removeprefix(BUILTIN_PREFIX)
            path = builtin_pack(name)
            if not path.is_file():
                known = ", ".join(BUILTIN_PREFIX + p for p in builtin_packs())
                problems.append(Problem(*where, f"no shipped rule pack {pattern!r}; shipped: {known}"))
                continue
            files.append((pattern, path))
            continue
        full = os.path.expanduser(pattern if os.path.isabs(pattern) else str(base / pattern))
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        if not matches:
            # A glob may match nothing yet (an empty rules.d/): say so, and carry on.
            problems.append(Problem(*where, f"no rule file matches {pattern!r} yet", warning=True))
        for match in matches:
            files.append((match, Path(match)))
    return list(dict.fromkeys(files))


def _load_rule_file(
    path: Path, label: str, problems: list[Problem], refs: list[RuleRef]
) -> list[LoadedRule] | None:
    """The file's valid rules; every rule read, valid or not, also goes to ``refs`` for the
    cross-checks. None when the file cannot be read as a rule file at all."""
    try:
        data = load_yaml(path, label=label)
    except FileProblems as exc:
        problems.extend(exc.problems)
        return None
    if not isinstance(data, dict):
        problems.append(
            Problem(label, line_of(data, ()), "", "a rule file is a mapping with a `rules:` list")
        )
        return None
    out: list[LoadedRule] = []
    raw_rules = data.get("rules")
    try:
        RuleFile.model_validate(data)
    except ValidationError as exc:
        problems.extend(validation_problems(label, data, exc))
        if not isinstance(raw_rules, list):
            return None
    # Keep every rule that is valid on its own, so one typo does not hide the other rules' problems;
    # one that is not is still cross-checked with what is valid of it.
    for index, raw in enumerate(raw_rules or []):
        line = line_of(data, ("rules", index))
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as exc:
            refs.append(left_out(raw, exc, label, line, index))
            continue
        lines = raw.key_lines if isinstance(raw, LineDict) else {}
        out.append(LoadedRule(rule, label, line, index, dict(lines)))
        refs.append(ref_of(out[-1]))
    return out


def _load_actions(
    config: Config, data: Any, label: str, problems: list[Problem], base: Path
) -> dict[str, Action]:
    """The configured action instances. Paths in them are relative to the config's directory."""
    actions: dict[str, Action] = {}
    declared: dict[str, Any] = {**BUILTIN_INSTANCES, **config.actions}
    for name, raw in declared.items():
        where = ("actions", name)
        if not isinstance(raw, dict) or "type" not in raw:
            problems.append(Problem(label, line_of(data, where), f"actions.{name}", "needs a `type`"))
            continue
        cls = ACTION_TYPES.get(str(raw["type"]))
        if cls is None:
            known = ", ".join(sorted(ACTION_TYPES))
            problems.append(
                Problem(
                    label,
                    line_of(data, (*where, "type")),
                    f"actions.{name}.type",
                    f"unknown action type {raw['type']!r}; known: {known}",
                )
            )
            continue
        try:
            params: BaseModel = cls.Params.model_validate(raw, context={"base": base})
        except ValidationError as exc:
            problems.extend(validation_problems(label, data, exc, prefix=where))
            continue
        try:
            actions[name] = cls(name, params)  # type: ignore[arg-type]
        except ValueError as exc:  # a secret it cannot read, say
            problems.append(Problem(label, line_of(data, where), f"actions.{name}", str(exc)))
    for name, action in actions.items():
        try:
            action.connect(actions)
        except ValueError as exc:  # names an action that is not there, or of the wrong type
            if any(used in declared and used not in actions for used in action.uses()):
                continue  # it names one that could not be built: that one's error is listed
            problems.append(Problem(label, line_of(data, ("actions", name)), f"actions.{name}", str(exc)))
    return actions


def _check_coordination(loaded: Loaded, data: Any) -> None:
    """The fleet's store can be used as configured: its client installed (the ``fleet`` extra),
    its password readable. (Whether it answers is the daemon's to find out, and fail safe.)"""
    section = loaded.config.coordination
    if section is None:
        return
    label = loaded.config_file or "<defaults>"
    module, library = ("redis", "redis-py") if section.store == "redis" else ("etcd3gw", "etcd3gw")
    if importlib.util.find_spec(module) is None:
        loaded.problems.append(Problem(
            label, line_of(data, ("coordination", "store")), "coordination.store",
            f"{section.store} needs the {library} client, which is not installed: pip install 'specguard[fleet]'",
        ))  # fmt: skip
    _secret(
        section.password,
        "the fleet store's password",
        ("coordination", "password"),
        data,
        label,
        loaded.problems,
    )
    if section.store == "etcd" and (section.user is None) != (section.password is None):
        loaded.problems.append(Problem(
            label, line_of(data, ("coordination",)), "coordination",
            "etcd's authentication needs both `user` and `password`",
        ))  # fmt: skip


def _check_report_history(loaded: Loaded, data: Any) -> None:
    """With the Prometheus source the daemon reads no /metrics of its own: history, and the report's
    figures, come only from the servers listed under history.scrape."""
    config = loaded.config
    if config.sources.prometheus is None or not config.history.enabled or config.history.scrape is not None:
        return
    if "history" in loaded.invalid_keys:  # its targets may be what is in error
        return
    loaded.problems.append(
        Problem(
            loaded.config_file or "<defaults>",
            line_of(data, ("sources", "prometheus")),
            "history.scrape",
            "with the Prometheus source the daemon keeps history only of the vLLM servers listed under "
            "history.scrape.targets: without them the weekly report has no acceptance or latency figures",
            warning=True,
        )
    )


def _check_report_slack(loaded: Loaded, data: Any) -> None:
    name = loaded.config.report.slack
    if name is None or "actions" in loaded.invalid_keys:
        return
    action = loaded.actions.get(name)
    why = (
        f"no action named {name!r}" if action is None and name not in loaded.config.actions
        else f"{name!r} is not a slack action" if action is not None and action.type != "slack"
        else None
    )  # fmt: skip
    if why is not None:
        loaded.problems.append(
            Problem(
                loaded.config_file or "<defaults>",
                line_of(data, ("report", "slack")),
                "specguard.report.slack",
                f"{why}: name a `slack` action",
            )
        )


def _load_baseline(config: Config, data: Any, label: str, problems: list[Problem]) -> Baseline | None:
    if config.baseline is None:
        return None
    path = config.baseline
    if not path.is_file():
        reason = "no such file" if not path.exists() else "not a file"
        problems.append(
            Problem(label, line_of(data, ("baseline",)), "baseline", f"cannot read {path}: {reason}")
        )
        return None
    try:
        raw = load_yaml(path)  # JSON is YAML: this keeps line numbers for errors
    except FileProblems as exc:
        problems.extend(exc.problems)
        return None
    try:
        baseline = parse_baseline(raw)
    except ValidationError as exc:
        problems.extend(validation_problems(str(path), raw, exc))
        return None
    for index, entry in enumerate(baseline.entries if baseline.version == 2 else ()):
        said = entry.client_figures_warning()
        if said:  # a latency rule against a client's figures may fire on a healthy server
            where = line_of(raw, ("entries", index))
            problems.append(Problem(str(path), where, f"entries[{index}]", said, warning=True))
    return baseline


def _secret(ref: SecretRef | None, what: str, where: tuple[str, ...], data: Any, label: str,
            problems: list[Problem]) -> str | None:  # fmt: skip
    """The secret ``ref`` names, or None; a secret that cannot be read is a problem at ``where``."""
    if ref is None:
        return None
    try:
        return ref.read(what)
    except ValueError as exc:
        problems.append(Problem(label, line_of(data, where), ".".join(where), str(exc)))
        return None


def _prometheus_token(config: Config, data: Any, label: str, problems: list[Problem]) -> str | None:
    prometheus = config.sources.prometheus
    if prometheus is None:
        return None
    where = ("sources", "prometheus", prometheus.token_field)
    return _secret(prometheus.token_ref(), "bearer token", where, data, label, problems)


def _webhook_token(config: Config, data: Any, label: str, problems: list[Problem]) -> str | None:
    """The webhook's token. It must be readable; off loopback there must be one."""
    server = config.server
    ref = server.token_ref()
    if ref is not None:
        where = ("server", server.token_field)
        return _secret(ref, "webhook token", where, data, label, problems)
    if not server.loopback:
        where = ("server", "listen")
        problems.append(
            Problem(
                label,
                line_of(data, where),
                ".".join(where),
                f"listening on {server.listen} would take Alertmanager webhooks from anyone: set "
                "server.webhook_token (e.g. {credential: webhook-token}), --webhook-token-file, or "
                f"give the unit the systemd credential {CREDENTIAL_NAME}; or listen on 127.0.0.1",
            )
        )
    return None


def check_state_dir(loaded: Loaded, data: Any = None) -> Problem | None:
    """Whether this user could keep the state database where the config says (``specguard check``).

    Nothing is created: the directory, or the nearest directory above it that exists, must be
    writable.
    """
    if "state_dir" in loaded.invalid_keys:  # its own error is listed
        return None
    directory = loaded.config.resolved_state_dir()
    line = line_of(data, ("state_dir",)) if data is not None else None
    where = (loaded.config_file or "<defaults>", line, "state_dir")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return Problem(*where, f"{directory}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = directory if existing == directory else f"{existing} (to create {directory})"
        return Problem(*where, f"{what} is not writable for this user: fix its permissions, or set state_dir")
    return None
