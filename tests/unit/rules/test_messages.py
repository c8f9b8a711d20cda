"""Messages worded per transition (``messages:``): which wording each event gets, the defaults a
rule that words fewer gets, old configs with one summary, and the mistakes `specguard check` names
by file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specguard.cli import main
from specguard.rules.messages import Wording, message, wording_of
from specguard.rules.schema import Messages, Rule

LABELS = {"instance": "a:8000", "model_name": "m"}


def rule(**fields: Any) -> Rule:
    raw = {"name": "low", "signal": "acceptance_rate", "condition": "< 0.4", **fields}
    return Rule.model_validate(raw)


def say(r: Rule, previous: str, kind: str, value: float | None, labels: dict[str, str] | None = None) -> str:
    labels = LABELS if labels is None else labels
    return message(r, kind=kind, previous=previous, value=value, threshold=0.4, labels=labels).text


WORDED = {
    "breach": "{value:.2f} below {threshold} on {labels[instance]}: fires after {for}",
    "still_breaching": "{value:.2f} below {threshold} for {for} on {labels[instance]}",
    "recovered": "{value:.2f} on {labels[instance]}: back at or above {threshold}",
    "no_data": "{signal} on {labels[instance]}: {change}",
}


@pytest.mark.parametrize(
    ("kind", "value", "wording"),
    [
        ("pending", 0.3, Wording.BREACH),
        ("firing", 0.3, Wording.STILL_BREACHING),
        ("inactive", 0.7, Wording.RECOVERED),
        ("resolved", 0.7, Wording.RECOVERED),
        ("pending", None, Wording.NO_DATA),
        ("firing", None, Wording.NO_DATA),
        ("inactive", None, Wording.NO_DATA),
        ("resolved", None, Wording.NO_DATA),
    ],
)
def test_each_transition_gets_the_wording_its_value_bears_out(
    kind: str, value: float | None, wording: Wording
) -> None:
    assert wording_of(kind, value) is wording


def test_a_rule_that_words_each_transition_says_each_in_its_own_words() -> None:
    r = rule(**{"for": "10m"}, messages=WORDED)
    assert say(r, "inactive", "pending", 0.31) == "0.31 below 0.4 on a:8000: fires after 10m"
    assert say(r, "pending", "firing", 0.3) == "0.30 below 0.4 for 10m on a:8000"
    assert say(r, "pending", "inactive", 0.7) == "0.70 on a:8000: back at or above 0.4"
    assert say(r, "firing", "resolved", 0.7) == "0.70 on a:8000: back at or above 0.4"
    assert say(r, "firing", "resolved", None) == (
        "acceptance_rate on a:8000: no data for longer than forget_after, the series is forgotten: resolved"
    )


def test_the_defaults_say_what_each_transition_shows_and_no_more() -> None:
    r = rule(**{"for": "10m"})
    where = "instance=a:8000, model_name=m"
    assert (
        say(r, "inactive", "pending", 0.31)
        == f"acceptance_rate 0.31 < 0.4 on {where}: breaching; fires if it lasts 10m"
    )
    assert say(r, "pending", "firing", 0.3) == f"acceptance_rate 0.3 < 0.4 on {where}: breaching for 10m"
    assert (
        say(r, "pending", "inactive", 0.7)
        == f"acceptance_rate 0.7 >= 0.4 on {where}: ok again: cleared before it fired"
    )
    assert say(r, "firing", "resolved", 0.7) == f"acceptance_rate 0.7 >= 0.4 on {where}: ok again: resolved"
    consecutive = rule(consecutive=3, keep_firing_for="2m")
    assert say(consecutive, "pending", "firing", 0.3).endswith(": breaching for 3 evaluations in a row")
    assert say(consecutive, "firing", "resolved", 0.7).endswith(": ok for 2m: resolved")


@pytest.mark.parametrize(
    ("policy", "previous", "kind", "labels", "said"),
    [
        ("breach", "inactive", "pending", LABELS, "no data, counted as a breach (no_data: breach); fires if it lasts 10m"),
        ("breach", "pending", "firing", LABELS, "no data, counted as a breach (no_data: breach) for 10m"),
        ("ok", "firing", "resolved", LABELS, "no data, counted as ok (no_data: ok): resolved"),
        ("ok", "pending", "inactive", LABELS, "no data, counted as ok (no_data: ok): cleared before it fired"),
        ("keep", "firing", "resolved", LABELS, "no data for longer than forget_after, the series is forgotten: resolved"),
        # the series that stands for "no series at all", closed because data is back
        ("breach", "firing", "resolved", {}, "reported again, so the missing-data breach is resolved"),
    ],
)  # fmt: skip
def test_a_move_without_a_value_says_what_the_missing_data_did(
    policy: str, previous: str, kind: str, labels: dict[str, str], said: str
) -> None:
    r = rule(**{"for": "10m"}, no_data=policy)
    where = "all series" if not labels else "instance=a:8000, model_name=m"
    assert say(r, previous, kind, None, labels) == f"acceptance_rate on {where}: {said}"


def test_an_old_rule_with_one_summary_says_it_at_the_firing_only() -> None:
    r = rule(
        **{"for": "10m"}, annotations={"summary": "Acceptance {value:.2f} below {threshold} for ten minutes"}
    )
    assert say(r, "pending", "firing", 0.3) == "Acceptance 0.30 below 0.4 for ten minutes"
    # the first breach has not lasted ten minutes, the recovery is no breach: the defaults say those
    assert say(r, "inactive", "pending", 0.3).endswith("breaching; fires if it lasts 10m")
    assert say(r, "firing", "resolved", 0.7).startswith("acceptance_rate 0.7 >= 0.4")
    assert "Acceptance" not in say(r, "firing", "resolved", None)


def test_a_breach_wording_stands_in_for_the_firing_not_for_the_recovery() -> None:
    r = rule(messages={"breach": "acceptance {value:.2f} below {threshold}"})
    assert say(r, "inactive", "pending", 0.3) == "acceptance 0.30 below 0.4"
    assert say(r, "pending", "firing", 0.3) == "acceptance 0.30 below 0.4"
    assert say(r, "firing", "resolved", 0.7) == (
        "acceptance_rate 0.7 >= 0.4 on instance=a:8000, model_name=m: ok again: resolved"
    )


def test_an_alert_rules_defaults_count_its_alerts_and_say_when_none_fire() -> None:
    r = Rule.model_validate({"name": "am", "alert": {"match": {"alertname": "AcceptanceLow"}}})
    assert say(r, "pending", "firing", 2.0, {"instance": "a:8000"}) == (
        '2 Alertmanager alert(s) {alertname="AcceptanceLow"} firing on instance=a:8000'
    )
    assert say(r, "firing", "resolved", 0.0, {"instance": "a:8000"}) == (
        'no Alertmanager alert {alertname="AcceptanceLow"} firing on instance=a:8000 any more: ok again: resolved'
    )


def test_a_wording_that_fails_to_render_is_replaced_by_the_default_and_said_so() -> None:
    # a wording that checks could not have let through (here: one built without them)
    r = rule().model_copy(update={"messages": Messages.model_construct(recovered="{value:.2f} {nope}")})
    said = message(r, kind="resolved", previous="firing", value=0.7, threshold=0.4, labels=LABELS)
    assert said.default and said.problem is not None and "cannot render template" in said.problem
    assert said.text.startswith("acceptance_rate 0.7 >= 0.4")


def test_every_placeholder_is_filled() -> None:
    r = rule(
        **{"for": "5m"},
        consecutive=2,
        severity="critical",
        messages={
            "still_breaching": "{rule} {signal} {severity} {previous}->{state} {condition} {where} "
            "{for} {consecutive} {value} {threshold} {labels[model_name]} | {change}"
        },
    )
    assert say(r, "pending", "firing", 0.3) == (
        "low acceptance_rate critical pending->firing < 0.4 instance=a:8000, model_name=m 5m 2 0.3 0.4 m "
        "| breaching for 5m and 2 evaluations in a row"
    )


# --- `specguard check`: mistakes in messages, by file, line and field -----------------------------

ONE_RULE = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    condition: "< 0.5"
"""


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("SPECGUARD_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    Path("cfg.yaml").write_text("rules: [rules.yaml]\n", encoding="utf-8")
    return tmp_path


def check(capsys: pytest.CaptureFixture[str], rules: str) -> tuple[int, str, list[str]]:
    Path("rules.yaml").write_text(rules, encoding="utf-8")
    code = main(["check", "--config", "cfg.yaml"])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if ": warning: " not in line]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (
            '      recovered: "Acceptance {valeu:.2f} back"\n',
            "rules.yaml:6: rules[0].messages.recovered: unknown template field {valeu}; available: value, "
            "threshold, labels, rule, signal, severity, state, previous, condition, where, for, consecutive, "
            "change (labels as {labels[name]})",
        ),
        (
            '      no_data: "Acceptance {value:.2f} on {labels[instance]}: none"\n',
            "rules.yaml:6: rules[0].messages.no_data: a no-data message has no value to show: leave out "
            "{value} ({change} says what the missing data did)",
        ),
        (
            '      breach: "below {threshold} for {for:.1f}"\n',
            "rules.yaml:6: rules[0].messages.breach: cannot render template 'below {threshold} for {for:.1f}': "
            "Unknown format code 'f' for object of type 'str'",
        ),
        (
            '      still_breaching: "{value"\n',
            "rules.yaml:6: rules[0].messages.still_breaching: invalid template '{value': expected '}' before "
            "end of string",
        ),
        (
            '      firing: "Acceptance {value}"\n',
            "rules.yaml:6: rules[0].messages.firing: unknown key",
        ),
    ],
)
def test_a_bad_message_is_named_by_file_line_and_field(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], messages: str, expected: str
) -> None:
    code, _, errors = check(capsys, ONE_RULE + "    messages:\n" + messages)
    assert code == 1
    assert errors == [expected, "1 error(s)"]


def test_every_bad_message_of_a_rule_is_listed_at_once(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = '      breach: "{nope}"\n      recovered: "{value"\n      no_data: "{value}"\n'
    code, _, errors = check(capsys, ONE_RULE + "    messages:\n" + messages)
    assert code == 1
    assert [line.split(": ", 2)[:2] for line in errors[:-1]] == [
        ["rules.yaml:6", "rules[0].messages.breach"],
        ["rules.yaml:7", "rules[0].messages.recovered"],
        ["rules.yaml:8", "rules[0].messages.no_data"],
    ]


def test_a_firing_worded_twice_is_refused(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = ONE_RULE + (
        '    annotations:\n      summary: "old {value}"\n    messages:\n      still_breaching: "new {value}"\n'
    )
    code, _, errors = check(capsys, rules)
    assert code == 1
    assert errors == [
        "rules.yaml:7: rules[0].messages: `still_breaching` and `annotations.summary` both give the firing's "
        "message: keep `messages.still_breaching` and drop `annotations.summary`",
        "1 error(s)",
    ]


def test_an_old_rule_file_with_only_a_summary_still_loads(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = ONE_RULE + '    annotations:\n      summary: "Acceptance {value:.2f} below {threshold}"\n'
    code, out, errors = check(capsys, rules)
    assert (code, errors) == (0, [])
    assert out.startswith("OK: 1 rules")
