"""The rule file schema: typed records, validated with pydantic; unknown keys are errors."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specguard.rules.conditions import Condition, parse_condition
from specguard.rules.durations import Duration, Interval
from specguard.rules.matchers import Matcher, all_match, parse_matchers
from specguard.rules.signals import CATALOG
from specguard.rules.templates import check_template, fields_of, root_of

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class NoDataPolicy(StrEnum):
    """What a rule does when its query returns nothing (vLLM down, no traffic, no speculation)."""

    KEEP = "keep"  # keep the current state and timers
    OK = "ok"  # count as ok: a firing rule resolves
    BREACH = "breach"  # count as a breach: missing data is itself the problem


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


def _condition(value: Any) -> Condition:
    if isinstance(value, Condition):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError("a condition needs an operator, e.g. '< 0.5' (quote it in YAML)")
    return parse_condition(value)


ConditionField = Annotated[Condition, PlainSerializer(str)]


def _template(value: str) -> str:
    check_template(value)
    return value


Template = Annotated[str, AfterValidator(_template)]


def _no_data_template(value: str) -> str:
    check_template(value)
    if any(root_of(field) == "value" for field in fields_of(value)):
        raise ValueError(
            "a no-data message has no value to show: leave out {value} "
            "({change} says what the missing data did)"
        )
    return value


class Messages(BaseModel):
    """``messages:``: what the log, Slack, ``history`` and the report say at each transition of a
    series, each worded for what its value shows (``rules.messages`` picks one per event):

    - ``breach``: a series starts breaching (it turns pending);
    - ``still_breaching``: the breach has lasted ``for`` and ``consecutive`` (it fires);
    - ``recovered``: its value no longer breaches (a pending series clears, a firing one resolves);
    - ``no_data``: it changed state without a value (the ``no_data`` policy, or a series gone).

    A wording left out gets a default that reads true for that transition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    breach: Template | None = None
    still_breaching: Template | None = None
    recovered: Template | None = None
    no_data: Annotated[str, AfterValidator(_no_data_template)] | None = None


class AlertStatus(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"
    ANY = "any"


class AlertMatch(BaseModel):
    """Alertmanager alerts a rule reacts to (webhook trigger), selected by label matchers.

    ``match`` has the syntax of a rule's ``match``: ``{alertname: X, severity: {"=~": "warn|crit"}}``.
    ``status`` (rules with a signal only): which alerts trigger an immediate evaluation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: dict[str, str | dict[str, str]] = Field(min_length=1)
    status: AlertStatus | None = None

    @field_validator("match", mode="before")
    @classmethod
    def _match(cls, value: Any) -> Any:
        parse_matchers(value)  # raises ValueError with the problem
        return value

    @cached_property
    def matchers(self) -> tuple[Matcher, ...]:
        return parse_matchers(self.match)  # validated already; parsed once, read per alert

    def triggers(self, status: str) -> bool:
        """Whether an alert with this status triggers an evaluation (signal rules)."""
        wanted = self.status or AlertStatus.FIRING
        return wanted is AlertStatus.ANY or wanted.value == status


# An alert rule's series breaches while at least one of its alerts fires (its value is how many do).
ALERT_CONDITION = parse_condition("> 0")

# The only signal a sequential detector reads: its likelihood is the chain model's.
DETECT_SIGNAL = "token_acceptance"


def _probability(value: float | None, name: str) -> None:
    if value is not None and not 0 < value < 1:
        raise ValueError(f"{name} is a per-token acceptance in (0, 1), got {value!r}")


def _levels(value: float | list[float] | None) -> tuple[float, ...]:
    if value is None:
        return ()
    return tuple(float(v) for v in value) if isinstance(value, list) else (float(value),)


class Detect(BaseModel):
    """``detect:``: a one-sided CUSUM on the chain model's per-token acceptance, instead of a
    threshold. It fires when the evidence that acceptance fell from ``in_control`` to ``shift_to``
    (or by ``drop``) reaches h = ln(false_alarm_every / interval), so that in-control traffic
    raises at most one false alarm per ``false_alarm_every`` on average (Lorden's bound).

    Several levels (``drop: [0.12, 0.3]``) run one CUSUM each, and the rule fires when any of them
    reaches h + ln(n): a small drop is caught by the first, a collapse sooner by the second, and
    the false-alarm bound holds for all of them together. With ``single_window`` (the default) a
    window whose own acceptance is at or below the mildest level fires too when its evidence by
    itself, with the window's own dispersion, reaches that threshold; it is one more of the n."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["cusum"] = "cusum"
    # α0: a number, the baseline file's token_acceptance for the series' model, or learned over
    # the warm-up (``learn``, which takes the baseline file's token_acceptance when there is one).
    in_control: float | Literal["learn", "baseline"] = "learn"
    shift_to: float | list[float] | None = None  # α1, the level(s) to detect
    drop: float | list[float] | None = None  # or α1 = α0 - drop
    false_alarm_every: Duration = Field(30 * 86400.0, gt=0)
    # Windows of traffic that estimate the overdispersion φ (and α0 when learned) before the
    # detector judges, once they pass a check that they hold one level (``engine.warmup``); kept in
    # the store across restarts.
    warmup: Duration = Field(3600.0, gt=0)
    min_trials: int = Field(100, ge=1)  # a window with fewer trials (S + F) is no data
    phi: float | None = Field(None, ge=1)  # fixed overdispersion instead of the warm-up's estimate
    # Beside the CUSUM, a test of each window by itself (its own dispersion, not the long-run one):
    # a sudden collapse shows in one window of a busy server, where the CUSUM, weighing every
    # window with the long-run φ, takes several.
    single_window: bool = True

    @model_validator(mode="after")
    def _shift(self) -> Detect:
        if (self.shift_to is None) == (self.drop is None):
            raise ValueError("give one of `shift_to` (the acceptance to detect) or `drop` (how far it falls)")
        if (isinstance(self.shift_to, list) and not self.shift_to) or (
            isinstance(self.drop, list) and not self.drop
        ):
            raise ValueError("give at least one level to detect")
        for value in _levels(self.shift_to):
            _probability(value, "shift_to")
        for value in _levels(self.drop):
            _probability(value, "drop")
        if isinstance(self.in_control, float | int):
            _probability(float(self.in_control), "in_control")
            for alpha1 in self.shifted(float(self.in_control)):
                if alpha1 >= self.in_control or alpha1 <= 0:
                    raise ValueError(
                        f"the shifted acceptance ({alpha1:g}) must lie below in_control "
                        f"({self.in_control:g}) and above 0"
                    )
        return self

    @property
    def levels(self) -> int:
        return len(_levels(self.shift_to) or _levels(self.drop))

    @property
    def tests(self) -> int:
        """How many tests share the false-alarm target: a CUSUM per level, and the window test."""
        return self.levels + (1 if self.single_window else 0)

    def shifted(self, alpha0: float) -> tuple[float, ...]:
        """The acceptances to detect when the in-control one is ``alpha0``."""
        if self.shift_to is not None:
            return _levels(self.shift_to)
        return tuple(alpha0 - drop for drop in _levels(self.drop))

    def describe(self) -> str:
        """``CUSUM on per-token acceptance: a fall of 0.12 / 0.3 from the learned level``."""
        to = " / ".join(f"{v:g}" for v in _levels(self.shift_to))
        by = " / ".join(f"{v:g}" for v in _levels(self.drop))
        level = {"learn": "the learned level", "baseline": "the baseline's level"}
        if isinstance(self.in_control, str):
            what = f"a fall to {to}" if to else f"a fall of {by}"
            return f"CUSUM on per-token acceptance: {what} from {level[self.in_control]}"
        start = f"{self.in_control:g}"
        return (
            f"CUSUM on per-token acceptance: {start} falling to {to}"
            if to
            else (f"CUSUM on per-token acceptance: {start} falling by {by}")
        )


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    signal: str | None = None
    expr: str | None = None
    window: Duration = 300.0
    interval: Interval | None = None  # None: the config's evaluation interval
    condition: ConditionField | None = None  # required with signal or expr; none for an alert rule
    for_: Duration = Field(0.0, alias="for")
    keep_firing_for: Duration = 0.0
    consecutive: int = Field(1, ge=1)  # breaching evaluations in a row needed to fire
    no_data: NoDataPolicy = NoDataPolicy.KEEP
    forget_after: Duration | None = None  # a series absent this long is forgotten; None: 5 x window
    group_by: tuple[str, ...] | None = None  # None: the signal's default labels
    match: dict[str, str | dict[str, str]] = Field(default_factory=dict)  # label matchers
    severity: Severity = Severity.WARNING
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, Template] = Field(default_factory=dict)
    messages: Messages = Field(default_factory=Messages)
    actions: tuple[str, ...] = ("log",)
    enabled: bool = True
    shadow: bool = False  # evaluate and record, never act
    # Alertmanager alerts: the rule's only input (an alert rule), or a trigger that evaluates the
    # rule's signal at once, besides its schedule.
    alert: AlertMatch | None = None
    # A sequential test instead of a condition (token_acceptance only); its window is the interval.
    detect: Detect | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("use letters, digits, '_', '.' or '-', starting with a letter or '_'")
        return value

    @field_validator("condition", mode="before")
    @classmethod
    def _parse_condition(cls, value: Any) -> Condition:
        return _condition(value)

    @field_validator("window")
    @classmethod
    def _window(cls, value: float) -> float:
        if value < 1:
            raise ValueError("the window must be at least 1s")
        return value

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for label in value or ():
            if not _LABEL.match(label) or label == "le":
                raise ValueError(f"{label!r} is not a label name that can be grouped by")
        return value

    @field_validator("match", mode="before")
    @classmethod
    def _match(cls, value: Any) -> Any:
        parse_matchers(value)  # raises ValueError with the problem
        return value

    @cached_property
    def matchers(self) -> tuple[Matcher, ...]:
        return parse_matchers(self.match)

    @field_validator("messages")
    @classmethod
    def _one_firing_message(cls, value: Messages, info: ValidationInfo) -> Messages:
        if value.still_breaching is not None and "summary" in (info.data.get("annotations") or {}):
            raise ValueError(
                "`still_breaching` and `annotations.summary` both give the firing's message: "
                "keep `messages.still_breaching` and drop `annotations.summary`"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for label in value:
            if not _LABEL.match(label):
                raise ValueError(f"{label!r} is not a valid label name")
        return value

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: str | None) -> str | None:
        if value is not None and value not in CATALOG:
            raise ValueError(f"unknown signal {value!r}; known: {', '.join(sorted(CATALOG))}")
        return value

    @property
    def key(self) -> str:
        """The rule's identity in the store and in metrics: its name."""
        return self.name

    @property
    def test(self) -> Condition:
        """What a series is compared with: the condition, "firing alerts > 0" for an alert rule, or
        "G >= h" for a detector (h comes with the interval: ``engine.detection`` sets it)."""
        if self.detect is not None:
            return Condition(op=">=", constant=math.inf, text="G >= h")
        return self.condition if self.condition is not None else ALERT_CONDITION

    def takes_alert(self, labels: Mapping[str, str], status: str) -> bool:
        """Whether an Alertmanager alert with ``labels`` and ``status`` moves this rule (an alert
        rule, whatever the status) or triggers its evaluation (a signal rule, by ``alert.status``)."""
        if self.alert is None or not all_match(self.alert.matchers, labels):
            return False
        return self.alert_only or self.alert.triggers(status)

    @property
    def alert_only(self) -> bool:
        """Driven by Alertmanager's alerts alone: no signal or expression of its own."""
        return self.alert is not None and self.signal is None and self.expr is None

    @model_validator(mode="after")
    def _one_query(self) -> Rule:
        if self.signal is not None and self.expr is not None:
            raise ValueError("give one of `signal` (from the catalog) or `expr` (PromQL), not both")
        if self.signal is None and self.expr is None:
            if self.alert is None:
                raise ValueError(
                    "give `signal` (from the catalog), `expr` (PromQL) or `alert` (Alertmanager alerts)"
                )
            if self.condition is not None:
                raise ValueError("an alert rule has no condition: a firing alert is its breach")
            if self.alert.status is not None:
                raise ValueError(
                    "an alert rule follows its alerts (firing fires it, resolved resolves it): "
                    "`alert.status` is for rules with a signal"
                )
            if self.match:
                raise ValueError("an alert rule selects alerts with `alert.match`, not `match`")
        elif self.detect is not None:
            if self.signal != DETECT_SIGNAL:
                raise ValueError(
                    f"`detect` reads the chain model's acceptance: give `signal: {DETECT_SIGNAL}`"
                )
            if self.condition is not None:
                raise ValueError("give `condition` (a threshold) or `detect` (a sequential test), not both")
            if "window" in self.model_fields_set:
                raise ValueError(
                    "a detector takes one window per evaluation: its window is its `interval`, "
                    "so leave `window` out"
                )
        elif self.condition is None:
            raise ValueError("a rule with a signal or expr needs a `condition`, e.g. '< 0.5'")
        return self


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[Rule]
