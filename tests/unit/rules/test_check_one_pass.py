"""`specguard check` lists every problem in one pass (a rule left out for its own errors is still
cross-checked, a config key in error does not hide the rule files), with no error that only follows
from another, and warns of actions no rule names and of a speedup rule whose baseline lacks the
draft's cost."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from specguard.cli import main
from specguard.config.loading import load


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECGUARD_CONFIG", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.chdir(tmp_path)


def write(path: str, text: str) -> None:
    Path(path).write_text(textwrap.dedent(text), encoding="utf-8")


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", "--config", "cfg.yaml", *args])
    out, err = capsys.readouterr()
    return code, out, err


def errors(err: str) -> list[str]:
    return [
        line
        for line in err.splitlines()
        if ": warning: " not in line and not re.fullmatch(r"\d+ error\(s\)", line)
    ]


def warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": warning: " in line]


FLAG = """\
  fallback:
    type: feature_flag
    file: {path: flag.json, engage: {speculative: false}, restore: {speculative: true}}
"""

SHRINK = """\
  shrink:
    type: vllm_restart
    ladder: [3, 0]
    env_file: {path: s.env}
    unit: vllm.service
"""

FALLBACK_RULE = """\
  - name: acceptance_fallback
    signal: acceptance_rate
    condition: "< 0.4"
    actions: [fallback]
"""


# --- every error in one pass ----------------------------------------------------------------------


def test_a_rule_with_a_schema_error_still_has_its_unknown_action_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n" + FLAG)
    write(
        "rules.yaml",
        """\
        rules:
          - name: acceptance_low
            signal: acceptance_rate
            condition: "< 0.5"
            for: soon
            actions: [fallbak]
        """,
    )
    code, _, err = check(capsys)
    assert code == 1
    assert errors(err) == [
        "rules.yaml:5: rules[0].for: invalid duration 'soon': use a number with a unit "
        "(ms, s, m, h, d, w), e.g. 30s, 5m, 1h30m",
        "rules.yaml:6: rules[0].actions: unknown action 'fallbak'; did you mean fallback? "
        "(configured: fallback, log)",
    ]
    assert err.rstrip().endswith("2 error(s)")


def test_a_rule_too_broken_to_validate_still_has_its_actions_and_name_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write(
        "rules.yaml",
        """\
        rules:
          - name: low
            signal: acceptance_rate
            condition: "< 0.5"
          - name: low
            signal: nope
            condition: "< 0.5"
            actions: [pager]
        """,
    )
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 2)[:2] for line in errors(err)] == [
        ["rules.yaml:5", "rules[1].name"],
        ["rules.yaml:6", "rules[1].signal"],
        ["rules.yaml:8", "rules[1].actions"],
    ]
    assert "duplicate rule name 'low' (first at rules.yaml:2)" in errors(err)[0]
    assert errors(err)[2].endswith("unknown action 'pager'; configured: log")


def test_errors_in_the_config_do_not_hide_those_of_its_rule_files(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "interval: soon\nlisen: 0.0.0.0\nrules: [rules.yaml]\nactions:\n" + FLAG)
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[fallbak]"))
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 2)[:2] for line in errors(err)] == [
        ["cfg.yaml:1", "interval"],
        ["cfg.yaml:2", "lisen"],
        ["rules.yaml:5", "rules[0].actions"],
    ]
    assert "unknown action 'fallbak'; did you mean fallback?" in errors(err)[2]


def test_the_loader_keeps_loading_past_a_config_key_in_error_but_the_config_is_not_ok() -> None:
    write("cfg.yaml", "interval: soon\nrules: [rules.yaml]\n")
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[log]"))
    loaded = load(Path("cfg.yaml"))
    assert not loaded.ok
    assert loaded.invalid_keys == {"interval"}
    assert [r.name for r in loaded.rules] == ["acceptance_fallback"]
    assert [p.field for p in loaded.errors] == ["interval"]


def test_an_action_that_cannot_be_built_is_one_error_not_also_unknown_in_its_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n  notify:\n    type: log\n    levle: warning\n")
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[notify]"))
    code, _, err = check(capsys)
    assert code == 1
    assert errors(err) == ["cfg.yaml:5: actions.notify.levle: unknown key"]


def test_a_drain_naming_a_flag_that_cannot_be_built_is_not_a_second_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken_flag = FLAG.replace("    file:", "    quiet_period: never\n    file:")
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n" + broken_flag + SHRINK + "    drain: fallback\n")
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[fallback, shrink]"))
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 2)[:2] for line in errors(err)] == [
        ["cfg.yaml:5", "actions.fallback.quiet_period"]
    ]


@pytest.mark.parametrize(
    ("config", "rules", "field"),
    [
        # actions in error: what they declare is unknown, so no rule's action is called unknown
        ("rules: [rules.yaml]\nactions: [fallback]\n", FALLBACK_RULE, "actions"),
        # the source in error: a PromQL rule is not told it needs the Prometheus source
        (
            "rules: [rules.yaml]\nsources: {prometheus: {url: not-a-url}}\n",
            '  - {name: raw, expr: "sum(up)", condition: "< 1"}\n',
            "sources.prometheus.url",
        ),
        # the baseline in error: a rule reading it is not told that none is configured
        (
            "rules: [rules.yaml]\nbaseline: [b.json]\n",
            '  - {name: lat, signal: e2e_latency_p95, condition: "> 1.2 * baseline.e2e_latency_p95"}\n',
            "baseline",
        ),
        # the rule files in error: the shipped pack is not checked (nor warned about) in their place
        ("rules: rules.yaml\n", "", "rules"),
    ],
)
def test_a_config_key_in_error_is_its_own_error_only(
    capsys: pytest.CaptureFixture[str], config: str, rules: str, field: str
) -> None:
    write("cfg.yaml", config)
    write("rules.yaml", "rules:\n" + rules)
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 2)[1] for line in errors(err)] == [field], err
    assert warnings(err) == [], err


# --- actions no rule names ------------------------------------------------------------------------


def test_an_action_no_rule_names_is_a_warning_at_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n" + FLAG + "  pager:\n    type: log\n")
    write("rules.yaml", "rules:\n" + FALLBACK_RULE)
    code, out, err = check(capsys)
    assert code == 0, err
    assert out.startswith("OK: 1 rules in 1 file(s), 3 action(s)")
    assert warnings(err) == [
        "cfg.yaml:6: warning: actions.pager: no rule lists this action in its `actions`, so it never runs "
        "(a rule's `actions` misspelt?)"
    ]


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        (FALLBACK_RULE + "    for: soon\n", "rules[0].for"),  # another field in error
        (FALLBACK_RULE.replace("[fallback]", "fallback"), "rules[0].actions"),  # not a list
    ],
)
def test_an_action_named_only_by_a_rule_in_error_is_not_unused(
    capsys: pytest.CaptureFixture[str], rule: str, field: str
) -> None:
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n" + FLAG)
    write("rules.yaml", "rules:\n" + rule)
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 2)[1] for line in errors(err)] == [field]
    assert warnings(err) == []


def test_actions_used_by_another_action_or_the_report_are_not_unused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLACK_TOKEN", "xoxb-test")
    slack = "  oncall:\n    type: slack\n    token: {env: SLACK_TOKEN}\n    channel: C0123ABCD\n"
    write(
        "cfg.yaml",
        "rules: [rules.yaml]\nreport: {slack: oncall}\nactions:\n"
        + FLAG
        + SHRINK
        + "    drain: fallback\n"
        + slack,
    )
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[shrink]"))
    code, _, err = check(capsys)
    assert code == 0, err
    assert warnings(err) == []


def test_the_flag_a_broken_vllm_restart_drains_through_is_not_unused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the restart cannot be built (its ladder is in error), but its drain still names the flag
    broken = SHRINK.replace("ladder: [3, 0]", "ladder: three") + "    drain: fallback\n"
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n" + FLAG + broken)
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[shrink]"))
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 2)[1] for line in errors(err)] == ["actions.shrink.ladder"]
    assert warnings(err) == []


def test_a_vllm_restart_no_rule_names_is_said_to_step_only_by_hand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "rules: [rules.yaml]\nactions:\n" + SHRINK)
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[log]"))
    code, _, err = check(capsys)
    assert code == 0, err
    (line,) = warnings(err)
    assert line.startswith("cfg.yaml:3: warning: actions.shrink: no rule lists this action")
    assert "only when stepped by hand (`specguard ladder`)" in line


def test_unused_actions_are_not_guessed_when_some_rules_are_not_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "rules: [rules.yaml, broken.yaml]\nactions:\n" + FLAG)
    write("rules.yaml", "rules:\n" + FALLBACK_RULE.replace("[fallback]", "[log]"))
    write("broken.yaml", "rules: [\n")
    code, _, err = check(capsys)
    assert code == 1
    assert [line.split(": ", 1)[0] for line in errors(err)] == ["broken.yaml:2"]
    assert warnings(err) == []
    # rule files named on the command line are a part of the rules: no warning either
    code, _, err = check(capsys, "rules.yaml")
    assert (code, err) == (0, "")


# --- the draft's cost behind estimated_speedup ----------------------------------------------------

BASELINE_V2 = """\
{"version": 2, "measured_at": "2026-01-01T00:00:00Z", "entries": [
  {"model": "llama", "signals": {"e2e_latency_p95": 1.5, "e2e_latency_mean": 1.1}, "speculative": {"method": "eagle3"}},
  {"model": "qwen", "signals": {"e2e_latency_p95": 1.2, "e2e_latency_mean": 0.9}},
  {"model": "mistral", "signals": {"e2e_latency_p95": 1.2, "e2e_latency_mean": 0.9}, "speculative": {"method": "draft_model"}}
]}
"""


def test_a_baseline_without_the_draft_cost_the_speedup_rule_needs_is_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "baseline: baseline.json\n")  # the shipped pack: speculation_unprofitable
    write("baseline.json", BASELINE_V2)
    code, out, err = check(capsys)
    assert code == 0, err
    (line,) = [w for w in warnings(err) if "estimated_speedup" in w]
    assert re.match(
        r"builtin:speculative:\d+: warning: rules\[6\]\.signal: estimated_speedup needs the draft's cost",
        line,
    )
    assert (
        "the baseline entry for model qwen gives no speculative.method or draft_cost; "
        "the baseline entry for model mistral gives method 'draft_model', which has no default cost, "
        "and no draft_cost: the rule reports an error for the series those entries serve until "
        "baseline.json gives one"
    ) in line
    assert "llama" not in line
    assert "model qwen: no draft cost; model mistral: no draft cost" in out  # the listing stays


def test_a_baseline_that_gives_every_draft_cost_or_a_disabled_speedup_rule_has_no_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "baseline: baseline.json\n")
    write(
        "baseline.json",
        BASELINE_V2.replace(
            '"e2e_latency_mean": 0.9}}', '"e2e_latency_mean": 0.9}, "speculative": {"draft_cost": 0.1}}'
        ).replace('"draft_model"}', '"draft_model", "draft_cost": 0.2}'),
    )
    code, _, err = check(capsys)
    assert (code, err) == (0, "")
    write("cfg.yaml", "baseline: baseline.json\nrules: [rules.yaml]\n")
    write("baseline.json", BASELINE_V2)
    write(
        "rules.yaml",
        'rules:\n  - {name: slow, signal: estimated_speedup, condition: "< 1", enabled: false}\n',
    )
    code, _, err = check(capsys)
    assert (code, err) == (0, "")
