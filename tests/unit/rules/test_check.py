"""`specguard check` and the loader behind it: every problem as ``file:line: field: message``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specguard.cli import main
from specguard.common.secrets import SecretRef
from specguard.common.yamlfile import (
    FileProblems,
    LineDict,
    LineList,
    Problem,
    field_path,
    line_of,
    load_yaml,
)
from specguard.config.loading import builtin_pack, builtin_packs, load

GOOD_RULES = """\
rules:
  - name: my_acceptance_low
    signal: acceptance_rate
    window: 5m
    condition: "< 0.5"
    for: 10m
    actions: [log, notify]
  - name: my_latency_regression
    signal: e2e_latency_p95
    condition: "> 1.2 * baseline.e2e_latency_p95"
    keep_firing_for: 5m
    no_data: ok
    annotations:
      summary: "p95 {value:.3f}s over {threshold:.3f}s on {labels[instance]}"
"""

GOOD_CONFIG = """\
server:
  listen: 127.0.0.1
  port: 9464
sources:
  scrape:
    targets: [http://127.0.0.1:8000/metrics]
    timeout: 5s
rules: [rules.yaml, builtin:speculative]
actions:
  notify:
    type: log
    level: warning
baseline: baseline.json
state_dir: state
interval: 15s
dry_run: true
log_format: json
log_level: debug
"""

BASELINE = """\
{
  "version": 1,
  "measured_at": "2026-01-01T00:00:00Z",
  "method": "specguard bench, 200 requests",
  "signals": {
    "e2e_latency_p95": 1.84,
    "ttft_p95": 0.21,
    "e2e_latency_mean": 1.31
  },
  "speculative": {"method": "eagle3"}
}
"""

ONE_RULE = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    condition: "< 0.5"
"""

PROMETHEUS_CONFIG = """\
sources:
  prometheus:
    url: http://127.0.0.1:9090
rules: [rules.yaml]
"""
# ... and the vLLM server whose history the report reads (else `check` warns that it has none)
HISTORY = "history: {scrape: {targets: ['http://127.0.0.1:8000/metrics']}}\n"

EXPR_RULE = """\
rules:
  - name: custom_acceptance
    expr: sum(rate(vllm:spec_decode_num_accepted_tokens_total[5m]))
    condition: "< 10"
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty directory, with no config taken from the environment."""
    monkeypatch.delenv("SPECGUARD_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


def write(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def check_rules(
    capsys: pytest.CaptureFixture[str], rules: str, config: str = "rules: [rules.yaml]\n"
) -> tuple[int, str, str]:
    """Check ``rules`` as rules.yaml loaded by cfg.yaml (so paths print as written)."""
    write("cfg.yaml", config)
    write("rules.yaml", rules)
    return check(capsys, "--config", "cfg.yaml")


def error_lines(err: str) -> list[str]:
    """The errors printed (warnings and the final count left out)."""
    return [
        line
        for line in err.splitlines()
        if ": warning: " not in line and not re.fullmatch(r"\d+ error\(s\)", line)
    ]


def warning_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": warning: " in line]


def assert_one_error(code: int, err: str, expected_start: str) -> str:
    """Exactly one problem, starting with ``file:line: field:``; returns its line."""
    assert code == 1, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith(expected_start), lines[0]
    assert err.rstrip().endswith("1 error(s)")
    return lines[0]


# --- valid configurations -------------------------------------------------------------------------


def test_the_default_config_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check(capsys)
    assert code == 0, err
    assert re.fullmatch(r"OK: \d+ rules in 1 file\(s\), 1 action\(s\)\n", out)
    assert error_lines(err) == []
    assert "error(s)" not in err


def test_the_shipped_rules_that_need_a_baseline_are_only_warnings_without_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = check(capsys)
    assert code == 0
    assert out.startswith("OK:")
    assert error_lines(err) == []
    warnings = warning_lines(err)
    assert len(warnings) == 3, err
    for line, index in zip(warnings[::2], (4, 7), strict=True):  # latency_regression, latency_mean_regression
        assert re.fullmatch(
            rf"builtin:speculative:\d+: warning: rules\[{index}\]\.condition: "
            r"refers to the baseline, but no baseline file is configured.*",
            line,
        )
    assert re.fullmatch(
        r"builtin:speculative:\d+: warning: rules\[6\]\.signal: estimated_speedup needs the draft's cost .*",
        warnings[1],
    )


def test_a_full_config_with_its_rules_actions_and_baseline_is_valid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", GOOD_CONFIG)
    write("rules.yaml", GOOD_RULES)
    write("baseline.json", BASELINE)
    code, out, err = check(capsys, "--config", "cfg.yaml")
    assert (code, err) == (0, "")
    first, *rest = out.splitlines()
    assert re.fullmatch(r"OK: \d+ rules in 2 file\(s\), 2 action\(s\)", first)
    # then the baseline entry each rule that reads the baseline uses
    assert rest[0] == "baseline baseline.json (version 1, 1 entry):"
    assert "  latency_regression: default baseline: e2e_latency_p95 = 1.84" in rest
    assert "  speculation_unprofitable: default baseline: draft cost c = 0.05" in rest


def test_an_empty_config_file_means_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "")
    code, out, _ = check(capsys, "--config", "cfg.yaml")
    assert code == 0
    assert re.fullmatch(r"OK: \d+ rules in 1 file\(s\), 1 action\(s\)\n", out)


def test_the_config_can_come_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", "rules:\n  - name: a\n    signal: nope\n    condition: '< 1'\n")
    monkeypatch.setenv("SPECGUARD_CONFIG", "cfg.yaml")
    code, _, err = check(capsys)
    assert_one_error(code, err, "rules.yaml:3: rules[0].signal: unknown signal 'nope'")


# --- one test per kind of error -------------------------------------------------------------------


def test_an_unknown_key_in_a_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE + "    treshold: 0.5\n")
    assert_one_error(code, err, "rules.yaml:5: rules[0].treshold: unknown key")


def test_an_unknown_key_in_the_second_rule_names_that_rule_and_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rules = ONE_RULE + "  - name: b\n    signal: kv_cache_usage\n    condition: '> 0.9'\n    sevrity: info\n"
    code, _, err = check_rules(capsys, rules)
    assert_one_error(code, err, "rules.yaml:8: rules[1].sevrity: unknown key")


def test_an_unknown_key_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "interval: 5s\nlisen: 0.0.0.0\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:2: lisen: unknown key")


def test_listen_and_port_at_the_top_say_where_they_moved(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "interval: 5s\nport: 9464\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:2: port: `port` is now `server.port`")


def test_listening_beyond_loopback_without_a_webhook_token_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "server:\n  listen: 0.0.0.0\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: server.listen: listening on 0.0.0.0 would take")
    assert "server.webhook_token" in line and "credential webhook-token" in line


def test_listening_beyond_loopback_with_a_webhook_token_is_fine(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "server:\n  listen: 0.0.0.0\n  webhook_token_file: tok\n")
    write("tok", "s3cret\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0, err
    loaded = load(Path("cfg.yaml"))
    assert loaded.webhook_token == "s3cret"
    ref = loaded.config.server.token_ref()
    assert ref is not None and ref.file is not None and ref.file.resolve() == Path("tok").resolve()


def test_the_webhook_token_may_come_from_a_systemd_credential(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write("creds/webhook-token", "s3cret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(Path("creds").absolute()))
    write("cfg.yaml", "server:\n  listen: 0.0.0.0\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0, err
    loaded = load(Path("cfg.yaml"))
    assert loaded.config.server.token_ref() == SecretRef(credential="webhook-token")
    assert loaded.webhook_token == "s3cret"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "webhook token file tok is empty"),
        ("two words\n", "it holds whitespace or control characters"),
        (None, "cannot read it (No such file or directory)"),
    ],
)
def test_an_unusable_webhook_token_file(
    capsys: pytest.CaptureFixture[str], content: str | None, expected: str
) -> None:
    write("cfg.yaml", "server:\n  webhook_token_file: tok\n")
    if content is not None:
        write("tok", content)
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: server.webhook_token_file: webhook token file")
    assert expected in line
    assert "two words" not in err  # the secret itself is never printed


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("alertmanager", "is not a URL path"),
        ("/metrics", "is taken"),
        ("/api/x", "is taken"),
        ("/silences/expire", "is taken"),  # the status page's forms
        ("/a b", "is not"),
    ],
)
def test_a_bad_webhook_path(capsys: pytest.CaptureFixture[str], path: str, expected: str) -> None:
    write("cfg.yaml", f"server:\n  webhook_path: '{path}'\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: server.webhook_path:")
    assert expected in line


def test_an_unknown_nested_key_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "sources:\n  scrape:\n    target: [http://127.0.0.1:8000/metrics]\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:3: sources.scrape.target: unknown key")


def test_an_unknown_signal(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE.replace("acceptance_rate", "acceptance"))
    line = assert_one_error(code, err, "rules.yaml:3: rules[0].signal: unknown signal 'acceptance'")
    assert "acceptance_rate" in line  # the known signals are listed


def test_an_action_that_is_not_configured(capsys: pytest.CaptureFixture[str]) -> None:
    config = "rules: [rules.yaml]\nactions:\n  notify:\n    type: log\n"
    code, _, err = check_rules(capsys, ONE_RULE + "    actions: [log, page_oncall]\n", config)
    line = assert_one_error(code, err, "rules.yaml:5: rules[0].actions: unknown action 'page_oncall'")
    assert "unknown action 'page_oncall'; configured: log, notify" in line


def test_an_action_of_an_unknown_type_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "actions:\n  pager:\n    type: pagerduty\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:3: actions.pager.type: unknown action type 'pagerduty'")


def test_a_bad_action_parameter_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "actions:\n  quiet:\n    type: log\n    level: loud\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:4: actions.quiet.level: ")


def test_a_bad_duration(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE + "    for: 5 minutes\n")
    assert_one_error(code, err, "rules.yaml:5: rules[0].for: invalid duration '5 minutes'")


def test_a_bad_duration_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "interval: 15 seconds\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:1: interval: invalid duration '15 seconds'")


def test_a_bad_page_size_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "sources:\n  scrape:\n    max_page_size: 12 parsecs\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:3: sources.scrape.max_page_size: invalid size '12 parsecs'")


def test_a_missing_baseline_file_is_one_error_at_its_line_and_no_contradicting_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "interval: 5s\nbaseline: nope.json\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:2: baseline: cannot read nope.json: no such file")
    assert not [line for line in warning_lines(err) if "no baseline file is configured" in line], err


def test_a_state_directory_under_a_file_is_an_error_naming_both(capsys: pytest.CaptureFixture[str]) -> None:
    write("blocker", "a file")
    write("cfg.yaml", "state_dir: blocker/state\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:1: state_dir: blocker/state: blocker is not a directory")


def test_a_state_directory_that_does_not_exist_yet_is_not_created_by_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "state_dir: state\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0, err
    assert not Path("state").exists()


def test_a_bad_condition(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE.replace('"< 0.5"', '"below 0.5"'))
    assert_one_error(code, err, "rules.yaml:4: rules[0].condition: invalid condition 'below 0.5'")


def test_an_unquoted_number_condition_asks_for_an_operator(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE.replace('"< 0.5"', "0.5"))
    assert_one_error(code, err, "rules.yaml:4: rules[0].condition: a condition needs an operator")


def test_promql_expr_on_a_scrape_only_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, EXPR_RULE)
    assert_one_error(code, err, "rules.yaml:3: rules[0].expr: raw PromQL needs the prometheus source")


def test_promql_expr_is_accepted_with_a_prometheus_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check_rules(capsys, EXPR_RULE, PROMETHEUS_CONFIG + HISTORY)
    assert (code, err) == (0, "")
    assert out == "OK: 1 rules in 1 file(s), 1 action(s)\n"


def test_group_by_on_an_expr_rule_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, EXPR_RULE + "    group_by: [instance]\n", PROMETHEUS_CONFIG)
    assert_one_error(code, err, "rules.yaml:5: rules[0].group_by: ")


@pytest.mark.parametrize(
    ("match", "message"),
    [
        ('{position: {"=~": "(0"}}', "position=~'(0': invalid regular expression"),
        ('{position: {"~": "0"}}', "unknown matcher operator '~'; use one of =, !=, =~, !~"),
        ('{"0bad": "1"}', "'0bad' is not a label name"),
        ('"position=0"', "`match` is a mapping of label: value"),
    ],
)
def test_bad_label_matchers_name_the_rule_and_line(
    capsys: pytest.CaptureFixture[str], match: str, message: str
) -> None:
    code, _, err = check_rules(capsys, ONE_RULE + f"    match: {match}\n")
    assert code == 1
    (line,) = error_lines(err)
    assert line.startswith("rules.yaml:5: rules[0].match: "), line
    assert message in line


def test_match_on_an_expr_rule_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    rules = 'rules:\n  - name: raw\n    expr: up\n    condition: "< 1"\n    match: {job: vllm}\n'
    _, _, err = check_rules(capsys, rules, PROMETHEUS_CONFIG)
    assert error_lines(err) == [
        "rules.yaml:5: rules[0].match: match applies to signals; write the selector in expr"
    ]


def test_duplicate_rule_names_across_two_files(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "rules:\n  - first.yaml\n  - second.yaml\n")
    write("first.yaml", ONE_RULE)
    write("second.yaml", "# the same rule again\n" + ONE_RULE)
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(
        code,
        err,
        "second.yaml:3: rules[0].name: duplicate rule name 'acceptance_low' (first at first.yaml:2)",
    )


def test_duplicate_rule_names_in_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE + ONE_RULE.removeprefix("rules:\n"))
    assert_one_error(
        code, err, "rules.yaml:5: rules[1].name: duplicate rule name 'acceptance_low' (first at rules.yaml:2)"
    )


def test_invalid_yaml_syntax_reports_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    broken = ONE_RULE.replace("    condition:", "   condition:")  # one space short, line 4
    code, _, err = check_rules(capsys, broken)
    assert_one_error(code, err, "rules.yaml:4: invalid YAML: ")


def test_invalid_yaml_in_the_config_reports_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "port: 9464\nrules: [rules.yaml\ninterval: 15s\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:")
    assert re.match(r"cfg\.yaml:[23]: invalid YAML: ", line), line


def test_a_duplicate_yaml_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE + "    signal: kv_cache_usage\n")
    assert_one_error(code, err, "rules.yaml:5: invalid YAML: duplicate key 'signal' (first at line 3)")


def test_a_duplicate_key_in_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "port: 1\ninterval: 15s\nport: 2\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:3: invalid YAML: duplicate key 'port' (first at line 1)")


def test_a_rule_glob_that_matches_nothing_yet_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "rules:\n  - builtin:speculative\n  - rules.d/*.yaml\n")
    code, out, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0, err  # an empty rules.d/ does not stop the daemon from starting
    assert "cfg.yaml:3: warning: rules[1]: no rule file matches 'rules.d/*.yaml' yet" in warning_lines(err)
    assert out.startswith("OK:")


def test_a_rule_glob_loads_every_match_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "rules: [rules.d/*.yaml]\n")
    write("rules.d/b.yaml", ONE_RULE.replace("acceptance_low", "b_rule"))
    write("rules.d/a.yaml", ONE_RULE.replace("acceptance_low", "a_rule"))
    write("rules.d/notes.txt", "not a rule file")
    loaded = load(Path("cfg.yaml"))
    assert loaded.ok, loaded.problems
    assert [(r.name, Path(r.file).name, r.line) for r in loaded.rules] == [
        ("a_rule", "a.yaml", 2),
        ("b_rule", "b.yaml", 2),
    ]
    code, out, _ = check(capsys, "--config", "cfg.yaml")
    assert (code, out) == (0, "OK: 2 rules in 2 file(s), 1 action(s)\n")


def test_a_missing_rule_file(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "rules: [nothere.yaml]\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "nothere.yaml: cannot read file")


def test_an_unknown_builtin_pack(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "rules:\n  - builtin:nope\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: rules[0]: no shipped rule pack 'builtin:nope'")
    assert line.endswith("shipped: builtin:speculative")


def test_a_baseline_with_an_unknown_signal(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "baseline: baseline.json\nrules: [rules.yaml]\n")
    write("rules.yaml", ONE_RULE)
    write("baseline.json", BASELINE.replace('"ttft_p95"', '"bogus_signal"'))
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "baseline.json:7: signals.bogus_signal: unknown signal 'bogus_signal'")


def test_a_baseline_without_the_signal_a_rule_refers_to_is_a_warning_as_no_baseline_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As without a baseline file: the rule reports an error until the file has the value (a file
    # from an older bench lacks the figures bench writes now), and the daemon can start.
    write("cfg.yaml", "baseline: baseline.json\nrules: [rules.yaml]\n")
    write("rules.yaml", ONE_RULE.replace('"< 0.5"', '"< 0.8 * baseline.acceptance_rate"'))
    write("baseline.json", BASELINE)
    code, out, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0 and out.startswith("OK:"), err
    assert warning_lines(err) == [
        "rules.yaml:4: warning: rules[0].condition: the baseline has no value for 'acceptance_rate': "
        "the rule reports an error until it has one (`specguard bench --write-baseline` writes it)"
    ]


def test_a_condition_on_a_baseline_signal_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, ONE_RULE.replace('"< 0.5"', '"> baseline.latency"'))
    assert_one_error(code, err, "rules.yaml:4: rules[0].condition: baseline.latency: no such signal")


def test_a_missing_bearer_token_file(capsys: pytest.CaptureFixture[str]) -> None:
    config = PROMETHEUS_CONFIG.replace("    url:", "    bearer_token_file: token\n    url:")
    code, _, err = check_rules(capsys, EXPR_RULE, config)
    assert_one_error(
        code, err, "cfg.yaml:3: sources.prometheus.bearer_token_file: bearer token file token: cannot read it"
    )


def test_a_bearer_token_file_that_is_a_directory(capsys: pytest.CaptureFixture[str]) -> None:
    Path("token").mkdir()
    config = PROMETHEUS_CONFIG.replace("    url:", "    bearer_token_file: token\n    url:")
    code, _, err = check_rules(capsys, EXPR_RULE, config)
    assert_one_error(
        code, err, "cfg.yaml:3: sources.prometheus.bearer_token_file: bearer token file token: cannot read it"
    )


def test_a_bearer_token_with_whitespace_inside_is_refused_at_check_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    Path("token").write_text("two words\n")
    config = PROMETHEUS_CONFIG.replace("    url:", "    bearer_token_file: token\n    url:")
    code, _, err = check_rules(capsys, EXPR_RULE, config)
    assert_one_error(
        code,
        err,
        "cfg.yaml:3: sources.prometheus.bearer_token_file: bearer token file token: it holds whitespace",
    )


def test_an_empty_bearer_token_file(capsys: pytest.CaptureFixture[str]) -> None:
    write("token", "\n")
    config = PROMETHEUS_CONFIG.replace("    url:", "    bearer_token_file: token\n    url:")
    code, _, err = check_rules(capsys, EXPR_RULE, config)
    assert_one_error(
        code, err, "cfg.yaml:3: sources.prometheus.bearer_token_file: bearer token file token is empty"
    )


def test_a_readable_bearer_token_file_is_accepted_and_never_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("token", "s3cr3t-token\n")
    config = PROMETHEUS_CONFIG.replace("    url:", "    bearer_token_file: token\n    url:") + HISTORY
    code, out, err = check_rules(capsys, EXPR_RULE, config)
    assert (code, err) == (0, "")
    assert "s3cr3t" not in out


def test_a_config_that_is_not_a_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "- rules.yaml\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert_one_error(code, err, "cfg.yaml:1: the config must be a mapping of keys")


def test_a_rule_file_that_is_not_a_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check_rules(capsys, "- name: a\n")
    assert_one_error(code, err, "rules.yaml:1: a rule file is a mapping with a `rules:` list")


def test_every_problem_is_listed_at_once_sorted_by_file_and_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rules = """\
    rules:
      - name: a
        signal: nope
        condition: "< 0.5"
      - name: b
        signal: acceptance_rate
        condition: "< 0.5"
        for: soon
      - name: c
        signal: acceptance_rate
        condition: "< 0.5"
        actions: [pager]
    """
    code, _, err = check_rules(capsys, rules)
    assert code == 1
    lines = error_lines(err)
    assert [line.split(": ", 2)[:2] for line in lines] == [
        ["rules.yaml:3", "rules[0].signal"],
        ["rules.yaml:8", "rules[1].for"],
        ["rules.yaml:12", "rules[2].actions"],
    ]
    assert err.rstrip().endswith("3 error(s)")


# --- rule files named on the command line ---------------------------------------------------------


def test_rule_files_on_the_command_line_replace_the_configured_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("cfg.yaml", "rules: [missing.yaml]\n")
    write("mine.yaml", ONE_RULE)
    code, out, err = check(capsys, "--config", "cfg.yaml", "mine.yaml")
    assert (code, err) == (0, "")
    assert out == "OK: 1 rules in 1 file(s), 1 action(s)\n"


def test_rule_files_on_the_command_line_without_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    write("mine.yaml", ONE_RULE + "    bogus: 1\n")
    code, _, err = check(capsys, "mine.yaml")
    line = assert_one_error(code, err, str(Path.cwd() / "mine.yaml") + ":5: ")
    assert line.endswith("rules[0].bogus: unknown key")


def test_rule_files_on_the_command_line_are_relative_to_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `specguard check -c /etc/specguard/specguard.yaml ./new.yaml` checks ./new.yaml, like promtool.
    write(tmp_path / "etc" / "specguard.yaml", "rules: [builtin:speculative]\n")
    write(tmp_path / "work" / "new.yaml", ONE_RULE)
    monkeypatch.chdir(tmp_path / "work")
    code, out, err = check(capsys, "--config", "../etc/specguard.yaml", "new.yaml")
    assert (code, err) == (0, "")
    assert out == "OK: 1 rules in 1 file(s), 1 action(s)\n"


# --- the loader ----------------------------------------------------------------------------------


def test_paths_in_the_config_are_relative_to_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = tmp_path / "etc"
    write(etc / "cfg.yaml", GOOD_CONFIG)
    write(etc / "rules.yaml", GOOD_RULES)
    write(etc / "baseline.json", BASELINE)
    monkeypatch.chdir(write(tmp_path / "elsewhere" / "x", "").parent)
    loaded = load(etc / "cfg.yaml")
    assert loaded.ok, loaded.problems
    assert loaded.problems == []
    assert loaded.config.baseline == etc / "baseline.json"
    assert loaded.config.state_dir == etc / "state"
    assert loaded.baseline is not None
    assert loaded.baseline.value({}, "e2e_latency_p95") == 1.84  # version 1, no model: the default
    assert sorted(loaded.actions) == ["log", "notify"]
    mine = [r for r in loaded.rules if r.file == str(etc / "rules.yaml")]
    assert [(r.name, r.line) for r in mine] == [("my_acceptance_low", 2), ("my_latency_regression", 8)]
    assert mine[0].group_by == ("instance", "model_name")
    assert mine[0].rule.for_ == 600.0


def test_the_bearer_token_path_is_relative_to_the_config_directory(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    write(etc / "cfg.yaml", PROMETHEUS_CONFIG.replace("    url:", "    bearer_token_file: tok\n    url:"))
    write(etc / "rules.yaml", EXPR_RULE)
    write(etc / "tok", "abc\n")
    loaded = load(etc / "cfg.yaml")
    assert loaded.ok, loaded.problems
    assert loaded.config.sources.prometheus is not None
    assert loaded.config.sources.prometheus.bearer_token_file == etc / "tok"
    assert loaded.rules[0].group_by == ()


def test_overrides_replace_the_configured_source() -> None:
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", EXPR_RULE)
    assert not load(Path("cfg.yaml")).ok
    loaded = load(
        Path("cfg.yaml"), (), {"sources": {"prometheus": {"url": "http://p:9090"}}, "server": {"port": None}}
    )
    assert loaded.ok, loaded.problems
    assert loaded.config.sources.kind == "prometheus"
    assert loaded.config.port == 9464  # a None override leaves the value alone


def test_a_rule_with_an_error_is_left_out_while_its_neighbours_load() -> None:
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", ONE_RULE + "  - name: b\n    signal: nope\n    condition: '< 1'\n")
    loaded = load(Path("cfg.yaml"))
    assert [r.name for r in loaded.rules] == ["acceptance_low"]
    assert [p.field for p in loaded.errors] == ["rules[1].signal"]


def test_disabled_rules_load_but_are_not_enabled() -> None:
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", ONE_RULE + "    enabled: false\n")
    loaded = load(Path("cfg.yaml"))
    assert [r.name for r in loaded.rules] == ["acceptance_low"]
    assert loaded.enabled_rules() == []


def test_the_shipped_pack_is_listed_and_loads_cleanly() -> None:
    assert "speculative" in builtin_packs()
    assert builtin_pack("speculative").is_file()
    loaded = load(None, [f"builtin:{name}" for name in builtin_packs()])
    assert loaded.errors == []
    assert {r.rule.signal for r in loaded.rules} >= {"acceptance_rate", "e2e_latency_p95"}


# --- yamlfile: where things came from ------------------------------------------------------------


def test_load_yaml_records_the_line_of_every_key_and_item() -> None:
    data = load_yaml(Path("x.yaml"), "a: 1\nb:\n  - x\n  - c: 2\n    d: 3\n")
    assert isinstance(data, LineDict)
    assert data.key_lines == {"a": 1, "b": 2}
    assert isinstance(data["b"], LineList)
    assert data["b"].item_lines == [3, 4]
    assert line_of(data, ("b", 1, "d")) == 5
    assert line_of(data, ("b", 1, "missing")) == 4  # the deepest part that exists
    assert line_of(data, ("b", 7)) == 2
    assert line_of(data, ()) == 1


def test_field_path_reads_like_the_yaml() -> None:
    assert field_path(("rules", 2, "condition")) == "rules[2].condition"
    assert field_path(("sources", "prometheus", "url")) == "sources.prometheus.url"
    assert field_path(()) == ""


def test_load_yaml_of_an_unreadable_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(FileProblems) as info:
        load_yaml(tmp_path / "absent.yaml")
    [problem] = info.value.problems
    assert problem.line is None
    assert problem.message.startswith("cannot read file")


@pytest.mark.parametrize(
    ("problem", "text"),
    [
        (Problem("f.yaml", 3, "rules[0].for", "bad"), "f.yaml:3: rules[0].for: bad"),
        (Problem("f.yaml", None, "", "bad"), "f.yaml: bad"),
        (Problem("f.yaml", 3, "x", "hm", warning=True), "f.yaml:3: warning: x: hm"),
    ],
)
def test_a_problem_prints_as_file_line_field_message(problem: Problem, text: str) -> None:
    assert str(problem) == text


# --- the real command ----------------------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPECGUARD_CONFIG"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_module_entry_point_reports_errors_and_exits_1() -> None:
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", ONE_RULE + "    for: 5 minutes\n")
    done = _run(sys.executable, "-m", "specguard", "check", "--config", "cfg.yaml")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "rules.yaml:5: rules[0].for: invalid duration '5 minutes'" in done.stderr.splitlines()[0]


def test_the_installed_console_script_exits_0_on_a_valid_config() -> None:
    script = Path(sys.executable).parent / "specguard"
    assert script.exists(), "the package is not installed (pip install -e .)"
    write("cfg.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", ONE_RULE)
    done = _run(str(script), "check", "--config", "cfg.yaml")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "OK: 1 rules in 1 file(s), 1 action(s)\n"


def test_a_feature_flag_without_a_backend(capsys: pytest.CaptureFixture[str]) -> None:
    write("cfg.yaml", "actions:\n  fallback:\n    type: feature_flag\n    quiet_period: 5m\n")
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: actions.fallback: ")
    assert (
        "give exactly one backend: `http` (a flag API), `file` (a flag file) or `nginx` (specguard's router); "
        "none is given"
    ) in line


def test_a_feature_flag_field_of_the_wrong_kind(capsys: pytest.CaptureFixture[str]) -> None:
    write(
        "cfg.yaml",
        """\
        actions:
          fallback:
            type: feature_flag
            file:
              path: flags.json
              engage: {speculative: false}
              restore: {speculative: true}
              reload: systemctl reload router
        """,
    )
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:8: actions.fallback.file.reload: ")
    assert "give the command as a list of arguments" in line


def test_a_feature_flag_token_that_cannot_be_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        "cfg.yaml",
        """\
        actions:
          fallback:
            type: feature_flag
            http: {url: "http://127.0.0.1:9/flags/spec", token: {file: secrets/router-token}}
        """,
    )
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: actions.fallback: ")
    assert "secrets/router-token: cannot read it (No such file or directory)" in line
    # and from the credentials directory, by name
    write("creds/router-token", "tok-123\n")
    write(
        "cfg.yaml",
        """\
        actions:
          fallback:
            type: feature_flag
            http: {url: "http://127.0.0.1:9/flags/spec", token: {credential: router-token}}
        """,
    )
    code, _, err = check(capsys, "--config", "cfg.yaml")
    line = assert_one_error(code, err, "cfg.yaml:2: actions.fallback: ")
    assert "credential 'router-token' needs $CREDENTIALS_DIRECTORY" in line
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(Path("creds").resolve()))
    code, out, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0, err
    assert "tok-123" not in out + err


def test_the_prometheus_source_without_history_targets_warns_that_the_report_has_no_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("rules.yaml", ONE_RULE)
    write("cfg.yaml", PROMETHEUS_CONFIG)
    code, _, err = check(capsys, "--config", "cfg.yaml")
    assert code == 0, err
    (line,) = [w for w in warning_lines(err) if "history.scrape" in w]
    assert line.startswith("cfg.yaml:2: warning: history.scrape: with the Prometheus source")
    write("cfg.yaml", PROMETHEUS_CONFIG + HISTORY)
    _, _, err = check(capsys, "--config", "cfg.yaml")
    assert not [w for w in warning_lines(err) if "history.scrape" in w]
    write("cfg.yaml", PROMETHEUS_CONFIG + "history: {enabled: false}\n")
    _, _, err = check(capsys, "--config", "cfg.yaml")
    assert not [w for w in warning_lines(err) if "history.scrape" in w]
