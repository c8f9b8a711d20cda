"""`specguard export`: Prometheus alerting rules and the Alertmanager receiver, as text.

The promtool and amtool checks, and the proof that the exported rules fire when specguard's do, are
in tests/integration/alerts/test_promtool_rules.py.
"""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from specguard.cli import main
from specguard.config.loading import Loaded, load
from specguard.daemon.evaluation import thresholds
from specguard.export.alertmanager import export_receiver, webhook_url
from specguard.export.go_templates import go_template
from specguard.export.prometheus_rules import RulesExport, export_rules
from specguard.export.scopes import entry_scopes
from specguard.rules.matchers import Matcher, all_match
from specguard.store.baseline import Entry

MEASURED_AT = "2026-11-30T10:00:00Z"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # files are written and shown relative to here


def write(name: str, text: str) -> Path:
    path = Path(name)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def loaded_with(rules: str, baseline: dict[str, Any] | None = None, config: str = "") -> Loaded:
    write("rules.yaml", rules)
    text = "rules: [rules.yaml]\n" + textwrap.dedent(config)
    if baseline is not None:
        write("baseline.json", json.dumps(baseline))
        text += "baseline: baseline.json\n"
    write("specguard.yaml", text)
    loaded = load(Path("specguard.yaml"))
    assert loaded.ok, [str(p) for p in loaded.problems]
    return loaded


def exported(rules: str, baseline: dict[str, Any] | None = None, config: str = "") -> RulesExport:
    return export_rules(loaded_with(rules, baseline, config), "9.9.9")


def alerting_rules(result: RulesExport) -> list[dict[str, Any]]:
    data = yaml.safe_load(result.text)
    return [rule for group in data["groups"] for rule in group["rules"]]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["export", *args])
    out, err = capsys.readouterr()
    return code, out, err


ACCEPTANCE = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    window: 5m
    condition: "< 0.5"
    for: 10m
    keep_firing_for: 2m
    severity: warning
    labels: {team: inference}
    annotations:
      summary: "Acceptance {value:.2f} below {threshold} on {labels[instance]}"
"""

LATENCY = """\
rules:
  - name: latency_regression
    signal: e2e_latency_p95
    window: 5m
    condition: "> 1.5 * baseline.e2e_latency_p95"
    annotations:
      summary: "p95 {value:.3f}s over {threshold:.3f}s"
"""


def baseline_v2(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"version": 2, "measured_at": MEASURED_AT, "entries": list(entries)}


# --- annotation templates -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{value}", "{{ $value }}"),
        ("{value:.2f}", '{{ printf "%.2f" $value }}'),
        ("{value:.3e}", '{{ printf "%.3e" $value }}'),
        ("{value:8.1f}", '{{ printf "%8.1f" $value }}'),
        ("{value:<8.1f}|", '{{ printf "%-8.1f" $value }}|'),
        ("{value:+.2f}", '{{ printf "%+.2f" $value }}'),
        ("{value:.3}", '{{ printf "%.3g" $value }}'),
        ("{value:g}", '{{ printf "%.6g" $value }}'),
        ("{value:f}", '{{ printf "%.6f" $value }}'),
        ("{value:.0%}", "{{ $value | humanizePercentage }}"),
        ("{labels[instance]}", "{{ $labels.instance }}"),
        ("{labels[model-name]}", '{{ index $labels "model-name" }}'),
        ("{threshold}", "0.5"),
        ("{threshold:.3f}s", "0.500s"),
        ("{rule}/{signal}/{severity}/{state}", "r/acceptance_rate/critical/firing"),
        ("{rule:>4}", "   r"),
        ("plain text", "plain text"),
        # Python's `{{` is a literal `{`: one `{` is literal in Go too, two would open an action.
        ("set {{x}} to {value}", "set {x} to {{ $value }}"),
        ("{{{{x}}}}", '{{ "{{" }}x}}'),
        ("{{{value}", '{{ "{" }}{{ $value }}'),
        ("{{{{{value}", '{{ "{{" }}{{ $value }}'),
        ("{{{{{{{value}", '{{ "{{" }}{{ "{" }}{{ $value }}'),
        ("end {{", "end {"),
    ],
)
def test_python_templates_become_go_templates(template: str, expected: str) -> None:
    text, problems = go_template(
        template, threshold=0.5, rule="r", signal="acceptance_rate", severity="critical"
    )
    assert (text, problems) == (expected, [])


@pytest.mark.parametrize("template", ["{value:,.2f}", "{value:^9.2f}", "{value:*>9}", "{value.real}"])
def test_a_value_format_go_cannot_print_falls_back_to_the_plain_value_and_says_so(template: str) -> None:
    text, problems = go_template(template, threshold=0.5, rule="r", signal="s", severity="info")
    assert text == "{{ $value }}"
    assert len(problems) == 1 and template in problems[0]


def test_annotations_are_exported_with_the_rule_threshold_and_an_unsupported_format_warns() -> None:
    rules = ACCEPTANCE.replace(
        'summary: "Acceptance', 'detail: "{value:,.1f} of {threshold:.2f}"\n      summary: "Acceptance'
    )
    result = exported(rules)
    (rule,) = alerting_rules(result)
    assert rule["annotations"] == {
        "detail": "{{ $value }} of 0.50",
        "summary": 'Acceptance {{ printf "%.2f" $value }} below 0.5 on {{ $labels.instance }}',
    }
    assert result.warnings == [
        "acceptance_low: annotation detail: {value:,.1f} has no Go template equivalent here: it prints as "
        "{{ $value }}"
    ]


def test_the_firing_wording_is_the_summary_prometheus_sends() -> None:
    rules = ACCEPTANCE.replace(
        '    annotations:\n      summary: "Acceptance {value:.2f} below {threshold} on {labels[instance]}"\n',
        "    messages:\n"
        '      breach: "first breach {value:.2f}"\n'
        '      still_breaching: "{value:.2f} below {threshold} for {for} ({previous} -> {state}): {change}"\n'
        '      recovered: "back at {value:.2f}"\n',
    )
    result = exported(rules)
    (rule,) = alerting_rules(result)
    assert rule["annotations"] == {
        "summary": '{{ printf "%.2f" $value }} below 0.5 for 10m (pending -> firing): breaching for 10m'
    }
    assert result.warnings == []


# --- one rule -------------------------------------------------------------------------------------


def test_a_rule_becomes_one_alerting_rule_with_its_timers_labels_and_severity() -> None:
    result = exported(ACCEPTANCE)
    assert result.exported == ["acceptance_low"] and result.warnings == []
    data = yaml.safe_load(result.text)
    assert data["groups"][0]["name"] == "specguard-15s"
    assert data["groups"][0]["interval"] == "15s"
    (rule,) = alerting_rules(result)
    assert rule["alert"] == "acceptance_low"
    assert rule["expr"] == (
        "(sum by (instance, model_name) (rate(vllm:spec_decode_num_accepted_tokens_total[5m])) / "
        "(sum by (instance, model_name) (rate(vllm:spec_decode_num_draft_tokens_total[5m])) > 0)) < 0.5"
    )
    assert (rule["for"], rule["keep_firing_for"]) == ("10m", "2m")
    assert rule["labels"] == {"team": "inference", "severity": "warning"}
    assert result.text.startswith(
        "# Prometheus alerting rules generated by `specguard export prometheus-rules` from specguard.yaml\n"
        "#   (specguard 9.9.9)."
    )


def test_match_group_by_and_the_interval_reach_the_query_and_the_group() -> None:
    rules = """\
    rules:
      - name: first_position
        signal: acceptance_by_position
        window: 1m
        interval: 30s
        match: {position: "0"}
        group_by: [instance, model_name]
        condition: "< 0.6"
    """
    (rule,) = alerting_rules(result := exported(rules))
    assert yaml.safe_load(result.text)["groups"][0]["name"] == "specguard-30s"
    assert rule["expr"] == (
        '(sum by (instance, model_name) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}[1m])) '
        "/ (sum by (instance, model_name) (rate(vllm:spec_decode_num_drafts_total[1m])) > 0)) < 0.6"
    )
    assert "for" not in rule and "keep_firing_for" not in rule


def test_rules_are_grouped_by_interval() -> None:
    rules = ACCEPTANCE + textwrap.indent(
        textwrap.dedent("""\
        - name: slow
          signal: kv_cache_usage
          interval: 1m
          condition: "> 0.95"
        - name: also_default
          signal: waiting_requests
          condition: "> 10"
        """),
        "  ",
    )
    data = yaml.safe_load(exported(rules, config="interval: 20s\n").text)
    assert [(g["name"], g["interval"], [r["alert"] for r in g["rules"]]) for g in data["groups"]] == [
        ("specguard-20s", "20s", ["acceptance_low", "also_default"]),
        ("specguard-1m", "1m", ["slow"]),
    ]


@pytest.mark.parametrize(
    ("extra", "interval", "expected_for"),
    [
        ("consecutive: 3\n", "15s", "30s"),  # fires on the third breaching evaluation: 2 intervals on
        ("consecutive: 3\n", "1m", "2m"),
        ("consecutive: 3\n    for: 5m\n", "1m", "5m"),  # `for` already waits longer
        ("consecutive: 4\n    for: 1m\n", "1m", "3m"),
    ],
)
def test_consecutive_becomes_for_over_the_interval(extra: str, interval: str, expected_for: str) -> None:
    rules = (
        "rules:\n  - name: fallback\n    signal: acceptance_rate\n"
        f'    interval: {interval}\n    condition: "< 0.4"\n    {extra}'
    )
    result = exported(rules)
    (rule,) = alerting_rules(result)
    assert rule["for"] == expected_for
    assert "# consecutive: " in result.text and f"= {expected_for}" in result.text
    assert result.warnings == []


def test_a_raw_expression_keeps_its_promql() -> None:
    rules = """\
    rules:
      - name: raw
        expr: 'sum by (instance) (vllm:num_requests_waiting{model_name="m"})'
        condition: ">= 20"
        severity: critical
    """
    (rule,) = alerting_rules(
        exported(rules, config="sources: {prometheus: {url: 'http://127.0.0.1:9090'}}\n")
    )
    assert rule["expr"] == '(sum by (instance) (vllm:num_requests_waiting{model_name="m"})) >= 20'
    assert rule["labels"] == {"severity": "critical"}


def test_no_data_policies_other_than_keep_are_commented_and_breach_warns() -> None:
    rules = ACCEPTANCE + textwrap.indent(
        textwrap.dedent("""\
        - name: gone_ok
          signal: kv_cache_usage
          condition: "> 0.95"
          no_data: ok
        - name: gone_breach
          signal: request_rate
          condition: "< 0.1"
          no_data: breach
        """),
        "  ",
    )
    result = exported(rules)
    assert result.exported == ["acceptance_low", "gone_ok", "gone_breach"]
    assert "# no_data: ok has no field in Prometheus" in result.text
    assert "# no_data: breach has no Prometheus equivalent" in result.text
    assert result.warnings == [
        "gone_breach: no_data: breach has no Prometheus equivalent: missing data will not fire"
    ]


def test_literal_braces_in_label_values_cannot_open_a_go_action() -> None:
    rules = ACCEPTANCE.replace("{team: inference}", '{team: "{{team}}"}')
    (rule,) = alerting_rules(exported(rules))
    assert rule["labels"]["team"] == '{{ "{{" }}team}}'


# --- what is left out, and why --------------------------------------------------------------------

SKIPPED = """\
rules:
  - name: kept
    signal: acceptance_rate
    condition: "< 0.5"
  - name: latency_regression
    signal: e2e_latency_p95
    condition: "> 1.2 * baseline.e2e_latency_p95"
  - name: speculation_unprofitable
    signal: estimated_speedup
    condition: "< 1.0"
  - name: switched_off
    signal: acceptance_rate
    condition: "< 0.5"
    enabled: false
  - name: from_alertmanager
    alert:
      match: {alertname: VllmDown}
"""


def test_rules_without_a_baseline_alert_rules_and_disabled_rules_are_left_out_and_named() -> None:
    result = exported(SKIPPED)
    assert result.exported == ["kept"]
    assert [rule["alert"] for rule in alerting_rules(result)] == ["kept"]
    assert set(result.skipped) == {
        "latency_regression",
        "speculation_unprofitable",
        "switched_off",
        "from_alertmanager",
    }
    assert result.warnings == [
        "latency_regression: not exported: '> 1.2 * baseline.e2e_latency_p95' needs a baseline, and the "
        "config names none",
        "speculation_unprofitable: not exported: estimated_speedup takes the draft's cost from a baseline, "
        "and the config names none",
    ]
    header = [line for line in result.text.splitlines() if line.startswith("#")]
    assert any(line.startswith("# Not exported: switched_off: disabled") for line in header)
    assert any(line.startswith("# Not exported: from_alertmanager: an alert rule") for line in header)


def test_the_command_prints_the_file_on_stdout_and_the_warnings_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loaded_with(SKIPPED)
    code, out, err = run(capsys, "prometheus-rules", "--config", "specguard.yaml")
    assert code == 0
    assert [rule["alert"] for group in yaml.safe_load(out)["groups"] for rule in group["rules"]] == ["kept"]
    assert err.splitlines() == [
        "specguard export: warning: latency_regression: not exported: '> 1.2 * baseline.e2e_latency_p95' "
        "needs a baseline, and the config names none",
        "specguard export: warning: speculation_unprofitable: not exported: estimated_speedup takes the "
        "draft's cost from a baseline, and the config names none",
    ]


def test_a_baseline_rule_on_a_raw_expression_needs_a_baseline_of_one_default_entry() -> None:
    rules = """\
    rules:
      - name: raw_latency
        expr: histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))
        condition: "> 2 * baseline.e2e_latency_p95"
    """
    prometheus = "sources: {prometheus: {url: 'http://127.0.0.1:9090'}}\n"
    default = {"version": 1, "measured_at": MEASURED_AT, "signals": {"e2e_latency_p95": 1.25}}
    (rule,) = alerting_rules(exported(rules, default, prometheus))
    assert rule["expr"].endswith(") > 2.5")
    per_model = baseline_v2({"model": "m", "signals": {"e2e_latency_p95": 1.0}})
    result = exported(rules, per_model, prometheus)
    assert result.exported == [] and "raw_latency" in result.skipped
    assert result.warnings[0].startswith(
        "raw_latency: not exported: its threshold depends on the baseline entry"
    )


# --- baseline entries: every series judged once, against specguard's threshold --------------------

THREE_ENTRIES = baseline_v2(
    {"signals": {"e2e_latency_p95": 1.0}},
    {"model": "llama", "signals": {"e2e_latency_p95": 2.0}},
    {"model": "llama", "instance": "10.0.0.7:8000", "signals": {"e2e_latency_p95": 3.0}},
)


def scope_of(expr: str) -> str:
    """The label matchers of an exported latency rule's selector."""
    return expr.split("_bucket", 1)[1].split("[", 1)[0]


def test_each_baseline_entry_gets_a_rule_over_the_series_it_is_the_most_specific_entry_for() -> None:
    result = exported(LATENCY, THREE_ENTRIES)
    rules = alerting_rules(result)
    assert [(scope_of(r["expr"]), r["expr"].rsplit(" ", 1)[1]) for r in rules] == [
        ('{model_name!~"llama"}', "1.5"),
        # A PromQL string doubles the regular expression's backslash.
        (r'{model_name="llama", instance!~"10\\.0\\.0\\.7:8000"}', "3"),
        ('{model_name="llama", instance="10.0.0.7:8000"}', "4.5"),
    ]
    assert [r["alert"] for r in rules] == ["latency_regression"] * 3
    # The = matchers are labels too: no alert changes, and promtool sees three distinct rules.
    assert [r["labels"] for r in rules] == [
        {"severity": "warning"},
        {"severity": "warning", "model_name": "llama"},
        {"severity": "warning", "model_name": "llama", "instance": "10.0.0.7:8000"},
    ]
    assert [r["annotations"]["summary"] for r in rules] == [
        'p95 {{ printf "%.3f" $value }}s over 1.500s',
        'p95 {{ printf "%.3f" $value }}s over 3.000s',
        'p95 {{ printf "%.3f" $value }}s over 4.500s',
    ]
    assert (
        "# threshold 4.5 = 1.5 x e2e_latency_p95 3 from the baseline entry for model llama and instance\n"
        f"      #   10.0.0.7:8000 (baseline.json, measured_at {MEASURED_AT.replace('Z', '+00:00')})"
    ) in result.text
    assert result.warnings == []


def test_the_exported_thresholds_are_the_ones_specguard_uses_series_by_series() -> None:
    loaded = loaded_with(LATENCY, THREE_ENTRIES)
    per_series = thresholds(loaded.rules[0], loaded.baseline)
    assert callable(per_series)
    rules = alerting_rules(export_rules(loaded, "9.9.9"))
    for model, instance in itertools.product(["llama", "qwen", ""], ["10.0.0.7:8000", "10.0.0.8:8000"]):
        labels = {"model_name": model, "instance": instance} if model else {"instance": instance}
        judging = [r for r in rules if all_match(_matchers(scope_of(r["expr"])), labels)]
        assert len(judging) == 1, (labels, judging)
        assert float(judging[0]["expr"].rsplit(" ", 1)[1]) == per_series(labels)


def _matchers(selector: str) -> tuple[Matcher, ...]:
    """Parse the exported selector back (values here hold no commas or quotes)."""
    out = []
    for part in selector.strip("{}").split(", "):
        for op in ("!~", "=~", "!=", "="):
            if op in part:
                label, value = part.split(op, 1)
                out.append(Matcher(label, op, value.strip('"').replace("\\\\", "\\")))
                break
    return tuple(out)


def test_a_model_and_instance_entry_whose_model_has_no_entry_splits_the_default() -> None:
    baseline = baseline_v2(
        {"signals": {"e2e_latency_p95": 1.0}},
        {"instance": "b:8000", "signals": {"e2e_latency_p95": 2.0}},
        {"model": "m", "instance": "a:8000", "signals": {"e2e_latency_p95": 3.0}},
    )
    rules = alerting_rules(exported(LATENCY, baseline))
    assert [(scope_of(r["expr"]), r["expr"].rsplit(" ", 1)[1]) for r in rules] == [
        ('{model_name!~"m", instance!~"b:8000"}', "1.5"),
        ('{model_name="m", instance!~"a:8000|b:8000"}', "1.5"),
        ('{instance="b:8000"}', "3"),
        ('{model_name="m", instance="a:8000"}', "4.5"),
    ]


def test_entries_for_labels_the_rule_does_not_keep_fit_no_series() -> None:
    rules = LATENCY.replace("    window: 5m\n", "    window: 5m\n    group_by: [instance]\n")
    (rule,) = alerting_rules(exported(rules, THREE_ENTRIES))
    assert rule["expr"] == (
        "(histogram_quantile(0.95, sum by (instance, le) "
        "(rate(vllm:e2e_request_latency_seconds_bucket[5m])))) > 1.5"
    )


def test_series_whose_entry_lacks_the_value_are_judged_by_no_rule_and_the_operator_is_told() -> None:
    baseline = baseline_v2(
        {"signals": {"e2e_latency_p95": 1.0}},
        {"model": "qwen", "signals": {"ttft_p95": 0.2}},
    )
    result = exported(LATENCY, baseline)
    assert [scope_of(r["expr"]) for r in alerting_rules(result)] == ['{model_name!~"qwen"}']
    assert result.warnings == [
        'latency_regression: series model_name="qwen" are judged by no rule: the baseline entry for model '
        "qwen has no value for 'e2e_latency_p95' (specguard reports an error for them)"
    ]


def test_estimated_speedup_divides_by_one_plus_k_c_with_c_from_each_entry() -> None:
    rules = """\
    rules:
      - name: speculation_unprofitable
        signal: estimated_speedup
        window: 2m
        condition: "< 1.0"
        for: 5m
    """
    baseline = baseline_v2(
        {"speculative": {"draft_cost": 0.1}},
        {"model": "eagle-model", "speculative": {"method": "eagle3"}},
        {"model": "ngram-model", "speculative": {"method": "ngram"}},
        {"model": "draft-model", "speculative": {"method": "draft_model"}},
    )
    result = exported(rules, baseline)
    exprs = [r["expr"] for r in alerting_rules(result)]
    assert exprs[0] == (
        "(1 + sum by (instance, model_name) (rate(vllm:spec_decode_num_accepted_tokens_total"
        '{model_name!~"draft-model|eagle-model|ngram-model"}[2m])) / (sum by (instance, model_name) '
        '(rate(vllm:spec_decode_num_drafts_total{model_name!~"draft-model|eagle-model|ngram-model"}[2m])) > 0)) '
        "/ (1 + (max by (instance, model_name) (count by (instance, engine, model_name) "
        '(vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name!~"draft-model|eagle-model|ngram-model"}))) '
        "* 0.1) < 1"
    )
    assert [e.rsplit(") * ", 1)[1] for e in exprs[1:]] == ["0.05) < 1", "0) < 1"]
    assert (
        "# c = 0.05 (the default for method eagle3) from the baseline entry for model eagle-model"
        in result.text
    )
    assert result.warnings == [
        'speculation_unprofitable: series model_name="draft-model" are judged by no rule: the baseline '
        "gives method 'draft_model' and no speculative.draft_cost: set draft_cost (for a draft model, "
        "about its parameter count / the target's) (specguard reports an error for them)"
    ]


MODELS = st.sampled_from(["a", "b", "c"])
INSTANCES = st.sampled_from(["x:1", "y:1", "z.1:1"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), MODELS), st.one_of(st.none(), INSTANCES)), unique=True, max_size=8
    )
)
def test_the_scopes_split_every_series_among_entries_as_entry_for_does(
    keys: list[tuple[str | None, str | None]],
) -> None:
    entries = [Entry(model=model, instance=instance) for model, instance in keys]
    scopes = entry_scopes(entries)
    for model, instance in itertools.product(["a", "b", "c", "d", None], ["x:1", "y:1", "z.1:1", "z11:1"]):
        labels = {"instance": instance, **({"model_name": model} if model else {})}
        judging = [entry for entry, parts in scopes for scope in parts if all_match(scope.matchers, labels)]
        fitting = [entry for entry in entries if entry.fits(labels)]
        expected = [max(fitting, key=lambda entry: entry.specificity)] if fitting else []
        assert judging == expected, (keys, labels)


# --- the command: bad input -----------------------------------------------------------------------


def test_an_invalid_config_prints_check_s_problems_and_writes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("rules.yaml", 'rules:\n  - name: x\n    signal: acceptance_rat\n    condition: "< 0.5"\n')
    write("specguard.yaml", "rules: [rules.yaml]\n")
    code, out, err = run(capsys, "prometheus-rules", "--config", "specguard.yaml", "--output", "out.yml")
    assert code == 1 and out == ""
    assert err.splitlines()[0].startswith("rules.yaml:3: rules[0].signal: unknown signal 'acceptance_rat'")
    assert "Traceback" not in err
    assert not Path("out.yml").exists()
    code, _, err = run(capsys, "alertmanager-receiver", "--config", "specguard.yaml")
    assert code == 1 and err.startswith("rules.yaml:3: rules[0].signal:")


@pytest.mark.parametrize("target", ["missing-dir/rules.yml", "a-directory"])
def test_an_unwritable_output_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str], target: str) -> None:
    Path("a-directory").mkdir()
    loaded_with(ACCEPTANCE)
    code, out, err = run(capsys, "prometheus-rules", "--config", "specguard.yaml", "--output", target)
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"specguard export: cannot write {target}: ")
    assert sorted(p.name for p in Path().iterdir()) == ["a-directory", "rules.yaml", "specguard.yaml"]
    assert list(Path("a-directory").iterdir()) == []


def test_output_replaces_the_file_whole_and_keeps_its_mode(capsys: pytest.CaptureFixture[str]) -> None:
    loaded_with(ACCEPTANCE)
    Path("rules.yml").write_text("old\n")
    Path("rules.yml").chmod(0o640)
    code, out, err = run(capsys, "prometheus-rules", "--config", "specguard.yaml", "--output", "rules.yml")
    assert code == 0 and out == ""
    assert err == "wrote 1 alerting rule(s), from 1 specguard rule(s), to rules.yml\n"
    assert yaml.safe_load(Path("rules.yml").read_text())["groups"][0]["rules"][0]["alert"] == "acceptance_low"
    assert Path("rules.yml").stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in Path().iterdir()) == ["rules.yaml", "rules.yml", "specguard.yaml"]


# --- the Alertmanager receiver --------------------------------------------------------------------


def receiver_config(
    capsys: pytest.CaptureFixture[str], config: str, *args: str
) -> tuple[dict[str, Any], str]:
    write("specguard.yaml", config)
    code, out, err = run(capsys, "alertmanager-receiver", "--config", "specguard.yaml", *args)
    assert code == 0, err
    return yaml.safe_load(out), err


def test_the_receiver_posts_to_the_configured_webhook_with_the_token_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("token", "s3cret\n")
    data, err = receiver_config(
        capsys, "server: {listen: 0.0.0.0, port: 9500, webhook_path: /hooks/am, webhook_token_file: token}\n"
    )
    assert data == {
        "route": {
            "receiver": "specguard",
            "group_by": ["alertname", "instance"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
        },
        "receivers": [
            {
                "name": "specguard",
                "webhook_configs": [
                    {
                        "url": "http://127.0.0.1:9500/hooks/am",
                        "send_resolved": True,
                        "max_alerts": 50,
                        "http_config": {
                            "authorization": {
                                "type": "Bearer",
                                "credentials_file": "/etc/alertmanager/specguard-token",
                            }
                        },
                    }
                ],
            }
        ],
    }
    assert err == ""


def test_the_receiver_header_explains_the_token_send_resolved_and_merging(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("specguard.yaml", "rules: [rules.yaml]\n")
    write("rules.yaml", "rules:\n  - name: down\n    alert:\n      match: {alertname: VllmDown}\n")
    code, out, _ = run(capsys, "alertmanager-receiver", "--config", "specguard.yaml")
    assert code == 0
    header = "\n".join(line for line in out.splitlines() if line.startswith("#"))
    assert "must hold the same token as specguard's server.webhook_token" in header
    assert "send_resolved must stay true" in header
    assert "#       - receiver: specguard\n#         matchers: ['alertname=\"VllmDown\"']" in header


@pytest.mark.parametrize(
    ("server", "url"),
    [
        ("{}", "http://127.0.0.1:9464/alertmanager"),
        ("{listen: localhost}", "http://127.0.0.1:9464/alertmanager"),
        ("{listen: '::', webhook_token_file: token}", "http://127.0.0.1:9464/alertmanager"),
        ("{listen: '::1'}", "http://[::1]:9464/alertmanager"),
        ("{listen: 10.0.0.5, port: 80, webhook_token_file: token}", "http://10.0.0.5:80/alertmanager"),
    ],
)
def test_the_webhook_url_reaches_the_listen_address(server: str, url: str) -> None:
    write("token", "s3cret\n")
    write("specguard.yaml", f"server: {server}\n")
    loaded = load(Path("specguard.yaml"))
    assert loaded.ok, loaded.problems
    assert webhook_url(loaded.config.server) == url


def test_flags_override_the_url_credentials_and_timers(capsys: pytest.CaptureFixture[str]) -> None:
    data, _ = receiver_config(
        capsys,
        "{}\n",
        "--url",
        "https://specguard.internal:8443/am",
        "--credentials-file",
        "/run/secrets/am-token",
        "--group-wait",
        "1s",
        "--group-interval",
        "90s",
        "--repeat-interval",
        "1h30m",
        "--timeout",
        "10s",
    )
    (webhook,) = data["receivers"][0]["webhook_configs"]
    assert webhook["url"] == "https://specguard.internal:8443/am"
    assert webhook["timeout"] == "10s"
    assert webhook["http_config"]["authorization"]["credentials_file"] == "/run/secrets/am-token"
    route = data["route"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        "1s",
        "1m30s",
        "1h30m",
    )


def test_without_a_webhook_token_in_specguard_s_config_the_operator_is_warned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, err = receiver_config(capsys, "{}\n")
    assert err.startswith("specguard export: warning: the config sets no server.webhook_token:")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group-wait", "soon"], "argument --group-wait: invalid duration 'soon'"),
        (["--url", "127.0.0.1:9464/am"], "argument --url: '127.0.0.1:9464/am' is not an http(s) URL"),
    ],
)
def test_bad_flags_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "alertmanager-receiver", *args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_timers_alertmanager_refuses_and_an_unknown_port_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write("specguard.yaml", "{}\n")
    code, out, err = run(
        capsys, "alertmanager-receiver", "--config", "specguard.yaml", "--group-interval", "0s"
    )
    assert (code, out) == (1, "")
    assert err == (
        "specguard export alertmanager-receiver: group_interval and repeat_interval must be above zero "
        "(Alertmanager refuses 0)\n"
    )
    write("specguard.yaml", "server: {port: 0}\n")
    code, out, err = run(capsys, "alertmanager-receiver", "--config", "specguard.yaml")
    assert (code, out) == (1, "")
    assert "server.port is 0" in err and len(err.splitlines()) == 1


def test_the_receiver_export_is_a_function_too() -> None:
    loaded = loaded_with(ACCEPTANCE)
    result = export_receiver(loaded, "9.9.9", credentials_file="token")
    assert result.text.startswith(
        "# Alertmanager configuration generated by `specguard export alertmanager-receiver`\n"
        "# from specguard.yaml (specguard 9.9.9).\n"
    )
