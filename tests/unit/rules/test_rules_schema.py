"""The rule schema (typed, strict) and the annotation templates it validates."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from specguard.rules.conditions import parse_condition
from specguard.rules.schema import AlertMatch, NoDataPolicy, Rule, RuleFile, Severity
from specguard.rules.templates import FIELDS, check_template, render


def rule(**fields: Any) -> Rule:
    data: dict[str, Any] = {"name": "acceptance_low", "signal": "acceptance_rate", "condition": "< 0.5"}
    data.update(fields)
    return Rule.model_validate({k: v for k, v in data.items() if v is not None})


def errors(**fields: Any) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as info:
        rule(**fields)
    return info.value.errors(include_url=False)


def locs(**fields: Any) -> list[tuple[Any, ...]]:
    return [item["loc"] for item in errors(**fields)]


# --- defaults and basic fields --------------------------------------------------------------------


def test_a_minimal_rule_gets_the_documented_defaults() -> None:
    r = rule()
    assert r.actions == ("log",)
    assert r.no_data is NoDataPolicy.KEEP
    assert r.for_ == 0.0
    assert r.keep_firing_for == 0.0
    assert r.consecutive == 1
    assert r.window == 300.0
    assert r.interval is None
    assert r.group_by is None
    assert r.severity is Severity.WARNING
    assert r.enabled is True
    assert r.shadow is False
    assert r.labels == {}
    assert r.annotations == {}
    assert r.expr is None
    assert r.alert is None
    assert r.key == "acceptance_low"


def test_the_condition_is_parsed_into_a_condition() -> None:
    assert rule(condition="> 1.2 * baseline.e2e_latency_p95").condition == parse_condition(
        "> 1.2 * baseline.e2e_latency_p95"
    )


def test_durations_are_parsed_to_seconds() -> None:
    r = rule(window="2m", interval="500ms", keep_firing_for="1h30m", **{"for": "10m"})
    assert (r.window, r.interval, r.keep_firing_for, r.for_) == (120.0, 0.5, 5400.0, 600.0)


def test_for_is_written_for_in_yaml() -> None:
    assert rule(**{"for": 90}).for_ == 90.0


def test_for_underscore_is_not_a_key_of_the_rule_file() -> None:
    assert ("for_",) in locs(for_="10m")


def test_the_rule_serialises_back_with_for_and_the_condition_text() -> None:
    dumped = rule(**{"for": "10m"}).model_dump(by_alias=True)
    assert dumped["for"] == 600.0
    assert dumped["condition"] == "< 0.5"


def test_the_rule_is_frozen() -> None:
    with pytest.raises(ValidationError):
        rule().name = "other"  # type: ignore[misc]


# --- strictness -----------------------------------------------------------------------------------


def test_unknown_keys_are_rejected() -> None:
    items = errors(treshold=0.5)
    assert [(item["loc"], item["type"]) for item in items] == [(("treshold",), "extra_forbidden")]


def test_unknown_keys_in_a_rule_file_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        RuleFile.model_validate({"rules": [], "groups": []})
    assert [item["loc"] for item in info.value.errors()] == [("groups",)]


def test_a_rule_needs_a_signal_an_expr_or_an_alert() -> None:
    items = errors(signal=None)
    assert "give `signal` (from the catalog), `expr` (PromQL) or `alert`" in items[0]["msg"]


def test_signal_and_expr_together_are_refused() -> None:
    items = errors(expr="vector(1)")
    assert "not both" in items[0]["msg"]


def test_an_alert_rule_fires_on_firing_alerts_and_has_no_condition() -> None:
    r = Rule.model_validate({"name": "am", "alert": {"match": {"alertname": "X"}}})
    assert r.alert_only and r.condition is None
    assert r.test.breached(1, r.test.threshold(None)) and not r.test.breached(0, r.test.threshold(None))
    assert "condition" in errors(signal=None, alert={"match": {"alertname": "X"}})[0]["msg"]


@pytest.mark.parametrize(
    ("alert", "extra", "message"),
    [
        (
            {"match": {"alertname": "X"}, "status": "resolved"},
            {},
            "`alert.status` is for rules with a signal",
        ),
        ({"match": {"alertname": "X"}}, {"match": {"instance": "a"}}, "selects alerts with `alert.match`"),
        ({"match": {}}, {}, "at least 1 item"),
        ({"match": {"alertname": {"=~": "("}}}, {}, "invalid regular expression"),
        ({"match": {"alertname": "X"}, "labels": {"a": "b"}}, {}, "Extra inputs are not permitted"),
    ],
)
def test_bad_alert_rules(alert: dict[str, object], extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Rule.model_validate({"name": "am", "alert": alert, **extra})


def test_expr_alone_is_accepted() -> None:
    r = Rule.model_validate({"name": "r", "expr": "vector(1)", "condition": "> 0"})
    assert (r.signal, r.expr) == (None, "vector(1)")


def test_an_unknown_signal_is_rejected_listing_the_known_ones() -> None:
    items = errors(signal="acceptance")
    assert items[0]["loc"] == ("signal",)
    assert "unknown signal 'acceptance'" in items[0]["msg"]
    assert "acceptance_rate" in items[0]["msg"]


def test_a_bare_number_condition_asks_for_an_operator() -> None:
    items = errors(condition=0.5)
    assert items[0]["loc"] == ("condition",)
    assert "needs an operator" in items[0]["msg"]


def test_a_malformed_condition_is_rejected_on_the_condition_field() -> None:
    items = errors(condition="below 0.5")
    assert items[0]["loc"] == ("condition",)
    assert "invalid condition 'below 0.5'" in items[0]["msg"]


def test_the_condition_is_required() -> None:
    assert "needs a `condition`" in errors(condition=None)[0]["msg"]


@pytest.mark.parametrize("name", ["1rule", "has space", "a/b", ""])
def test_rule_names_are_restricted(name: str) -> None:
    assert ("name",) in locs(name=name)


@pytest.mark.parametrize("name", ["acceptance_low", "_x", "a.b-c", "A1"])
def test_ordinary_rule_names_are_accepted(name: str) -> None:
    assert rule(name=name).name == name


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("for", "5 minutes"),
        ("window", "0.5s"),
        ("window", "1x"),
        ("interval", "50ms"),
        ("keep_firing_for", -1),
        ("consecutive", 0),
        ("no_data", "ignore"),
        ("severity", "page"),
        ("group_by", ["le"]),
        ("group_by", ["bad-label"]),
        ("labels", {"bad-label": "x"}),
        ("actions", "log"),
    ],
)
def test_invalid_field_values_are_rejected_on_that_field(field: str, value: Any) -> None:
    assert any(loc[0] == field for loc in locs(**{field: value}))


def test_no_data_accepts_the_three_policies() -> None:
    assert [rule(no_data=p).no_data for p in ("keep", "ok", "breach")] == [
        NoDataPolicy.KEEP,
        NoDataPolicy.OK,
        NoDataPolicy.BREACH,
    ]


def test_group_by_and_actions_become_tuples() -> None:
    r = rule(group_by=["instance"], actions=["log", "slack"])
    assert r.group_by == ("instance",)
    assert r.actions == ("log", "slack")


def test_alert_matchers_use_prometheus_operators_and_a_known_status() -> None:
    match = AlertMatch.model_validate({"match": {"alertname": "X", "severity": {"!~": "info|none"}}})
    assert [str(m) for m in match.matchers] == ['alertname="X"', 'severity!~"info|none"']
    assert match.triggers("firing") and not match.triggers("resolved")  # firing by default
    assert AlertMatch.model_validate({"match": {"a": "b"}, "status": "any"}).triggers("resolved")
    with pytest.raises(ValidationError, match="'firing', 'resolved' or 'any'"):
        AlertMatch.model_validate({"match": {"a": "b"}, "status": "pending"})


# --- annotation templates -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "acceptance {value:.2f} below {threshold} on {labels[instance]}",
        "{value:.0%} {threshold:.3f}",
        "{rule} {signal} {severity} {state}",
        "plain text",
        "{{literal braces}}",
    ],
)
def test_templates_over_known_fields_are_accepted(template: str) -> None:
    assert rule(annotations={"summary": template}).annotations == {"summary": template}


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{valeu:.2f}", "unknown template field {valeu}"),
        ("{instance}", "unknown template field {instance}"),
        ("{0}", "unknown template field {0}"),
        ("{value", "invalid template"),
        ("{value!z}", ""),
        ("{labels[instance]:.2f}", ""),
    ],
)
def test_bad_templates_are_rejected_when_the_rule_loads(template: str, message: str) -> None:
    items = errors(annotations={"summary": template})
    assert items[0]["loc"][:2] == ("annotations", "summary")
    assert message in items[0]["msg"]
    with pytest.raises(ValueError):
        check_template(template)


def test_the_unknown_field_message_lists_the_available_fields() -> None:
    with pytest.raises(ValueError) as info:
        check_template("{nope}")
    assert all(name in str(info.value) for name in FIELDS)


def test_render_fills_value_threshold_and_labels() -> None:
    text = render(
        "acceptance {value:.2f} < {threshold} on {labels[instance]} ({rule})",
        labels={"instance": "a:8000"},
        value=0.4321,
        threshold=0.5,
        rule="acceptance_low",
    )
    assert text == "acceptance 0.43 < 0.5 on a:8000 (acceptance_low)"


def test_render_shows_a_missing_label_as_empty() -> None:
    assert render("[{labels[instance]}]", labels={}, value=1.0, threshold=1.0) == "[]"


def test_render_shows_a_missing_value_as_a_dash() -> None:
    assert render("{value:.2f} vs {threshold}", labels={}, value=None, threshold=0.5) == "- vs 0.5"
