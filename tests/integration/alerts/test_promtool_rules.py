"""`specguard export` against the real tools: promtool (Prometheus 2.42) and amtool (Alertmanager 0.25).

The central test proves that the exported rules are specguard's rules, not just valid YAML: the same
synthetic vLLM series go through specguard's scrape source and engine, and through a `promtool test
rules` file generated from what specguard decided. The test file expects, at every evaluation, exactly
the alerts specguard had firing; promtool passes only if Prometheus fires and resolves each one at the
same evaluation.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from specguard.config.loading import Loaded, load
from specguard.daemon.evaluation import evaluate_rule
from specguard.export.alertmanager import export_receiver
from specguard.export.prometheus_rules import export_rules
from specguard.rules.templates import render
from specguard.sources.scrape import ScrapeSource
from specguard.store.records import State
from tests.pages import Clock
from tests.real import require_binary

pytestmark = pytest.mark.real

BASELINE = {
    "version": 2,
    "measured_at": "2026-11-30T10:00:00Z",
    "method": "specguard bench, 200 requests",
    "entries": [
        {
            "model": "llama",
            "signals": {"e2e_latency_p95": 1.84, "e2e_latency_mean": 1.2},
            "speculative": {"method": "eagle3"},
        },
        {
            "model": "llama",
            "instance": "10.0.0.7:8000",
            "signals": {"e2e_latency_p95": 2.1, "e2e_latency_mean": 1.4},
        },
        {"signals": {"e2e_latency_p95": 1.5, "e2e_latency_mean": 1.0}, "speculative": {"draft_cost": 0.1}},
    ],
}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool", "prometheus")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def write_config(directory: Path, config: str, rules: str | None = None, baseline: Any = None) -> Loaded:
    if rules is not None:
        (directory / "rules.yaml").write_text(textwrap.dedent(rules))
    if baseline is not None:
        (directory / "baseline.json").write_text(json.dumps(baseline))
    (directory / "specguard.yaml").write_text(textwrap.dedent(config))
    loaded = load(directory / "specguard.yaml")
    assert loaded.ok, [str(p) for p in loaded.problems]
    return loaded


# --- promtool check rules, amtool check-config ----------------------------------------------------


@pytest.mark.parametrize("with_baseline", [False, True], ids=["no-baseline", "baseline"])
def test_promtool_accepts_the_export_of_the_shipped_pack(tmp_path: Path, with_baseline: bool) -> None:
    loaded = write_config(
        tmp_path,
        "rules: [builtin:speculative]\n" + ("baseline: baseline.json\n" if with_baseline else ""),
        baseline=BASELINE if with_baseline else None,
    )
    result = export_rules(loaded, "test")
    (tmp_path / "rules.yml").write_text(result.text)
    checked = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Clean: no lint message either (promtool prints duplicate rules as "FAILED" with exit 0).
    assert "FAILED" not in checked.stdout + checked.stderr and "SUCCESS" in checked.stdout
    exported = [r["alert"] for g in yaml.safe_load(result.text)["groups"] for r in g["rules"]]
    # The detector is specguard's alone: its evidence carries over between evaluations.
    assert "acceptance_collapse" in result.skipped and "acceptance_collapse" not in exported
    if with_baseline:
        # latency_regression and latency_mean_regression: the three entries each;
        # speculation_unprofitable: the model entry and the default (the model+instance entry
        # gives no draft cost: an error in specguard, no rule).
        assert len(exported) == 4 + 3 + 2 + 3
        assert set(exported) == {
            "acceptance_low", "acceptance_critical", "acceptance_fallback", "memory_pressure",
            "latency_regression", "speculation_unprofitable", "latency_mean_regression",
        }  # fmt: skip
    else:
        assert set(exported) == {
            "acceptance_low",
            "acceptance_critical",
            "acceptance_fallback",
            "memory_pressure",
        }
        assert sorted(result.skipped) == [
            "acceptance_collapse",
            "latency_mean_regression",
            "latency_regression",
            "speculation_unprofitable",
        ]


def amtool_check(directory: Path, text: str) -> None:
    binary = require_binary("amtool", "prometheus-alertmanager")
    (directory / "alertmanager.yml").write_text(text)
    checked = subprocess.run(
        [binary, "check-config", "alertmanager.yml"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr + text
    assert "SUCCESS" in checked.stdout


@pytest.mark.parametrize(
    "config",
    [
        "{}\n",
        "server: {listen: 0.0.0.0, port: 9500, webhook_path: /hooks/am, webhook_token_file: token}\n",
        "server: {listen: '::1'}\n",
    ],
)
def test_amtool_accepts_the_receiver_config(tmp_path: Path, config: str) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    loaded = write_config(tmp_path, config)
    amtool_check(tmp_path, export_receiver(loaded, "test", credentials_file=str(tmp_path / "token")).text)
    timers = export_receiver(loaded, "test", group_wait=1.0, group_interval=2.0, repeat_interval=5400.0)
    amtool_check(tmp_path, timers.text)


def test_the_merge_the_receiver_header_describes_is_a_valid_config(tmp_path: Path) -> None:
    """An Alertmanager with its own receiver, plus specguard's receiver and the child routes the
    header comment shows (one per alert rule of the config)."""
    loaded = write_config(
        tmp_path,
        "rules: [rules.yaml]\n",
        rules="""\
        rules:
          - name: vllm_down
            alert:
              match: {alertname: VllmDown}
          - name: hot
            alert:
              match: {alertname: {"=~": "GpuHot|GpuVeryHot"}, severity: critical}
        """,
    )
    text = export_receiver(loaded, "test").text
    lines = text.splitlines()
    start = lines.index("#   route:")
    end = next(i for i, line in enumerate(lines) if line.startswith("# The `continue: true`"))
    example = yaml.safe_load("\n".join(line.removeprefix("# ") for line in lines[start:end]))
    assert example["route"]["routes"] == [
        {"receiver": "specguard", "matchers": ['alertname="VllmDown"'], "continue": True},
        {"receiver": "specguard", "matchers": ['alertname=~"GpuHot|GpuVeryHot"', 'severity="critical"'], "continue": True},
    ]  # fmt: skip
    ours = yaml.safe_load(text)
    merged = {
        "route": {"receiver": "ops", "group_by": ["alertname"], "routes": example["route"]["routes"]},
        "receivers": [{"name": "ops"}, *ours["receivers"]],
    }
    amtool_check(tmp_path, yaml.safe_dump(merged, sort_keys=False))


# --- annotations render in Prometheus as in specguard ---------------------------------------------

KV_PAGE_SERIES = 'vllm:kv_cache_usage_perc{engine="0", instance="vllm:8000", job="vllm", model_name="llama"}'


def test_annotations_render_in_prometheus_as_specguard_renders_them(tmp_path: Path) -> None:
    templates = {
        "summary": "KV {value:.3f} over {threshold} on {labels[instance]} ({labels[model_name]})",
        "detail": "{rule}/{signal}/{severity}/{state}: {value} {value:+.1e} [{value:8.2f}] [{value:<6.1f}] {value:.3}",
        "literal": "set {{x}} and {{{{not an action}}}} and {{{value:.1f}}} {labels[missing]}",
        "threshold": "{threshold:.3f} {threshold:>7}",
    }  # fmt: skip
    rules = "rules:\n  - name: kv_full\n    signal: kv_cache_usage\n    window: 1m\n"
    rules += '    condition: "> 0.6"\n    severity: critical\n    annotations:\n'
    rules += "".join(f"      {key}: {json.dumps(value)}\n" for key, value in templates.items())
    loaded = write_config(tmp_path, "rules: [rules.yaml]\n", rules=rules)
    result = export_rules(loaded, "test")
    assert result.warnings == []
    (tmp_path / "rules.yml").write_text(result.text)
    labels = {"instance": "vllm:8000", "model_name": "llama"}
    # A gauge at 0.75 for a minute averages to exactly 0.75 in both (a binary fraction: no rounding).
    expected = {
        key: render(
            template,
            labels=labels,
            value=0.75,
            threshold=0.6,
            rule="kv_full",
            signal="kv_cache_usage",
            severity="critical",
            state="firing",
        )
        for key, template in templates.items()
    }
    test_file = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": KV_PAGE_SERIES, "values": "0.75x8"}],
                "alert_rule_test": [
                    {
                        "eval_time": "60s",
                        "alertname": "kv_full",
                        "exp_alerts": [
                            {"exp_labels": {**labels, "severity": "critical"}, "exp_annotations": expected}
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test_file, sort_keys=False))
    tested = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert tested.returncode == 0, f"{tested.stdout}{tested.stderr}\nfiles kept in {tmp_path}"


# --- the exported rules fire and resolve when specguard's do --------------------------------------

STEP = 15  # seconds between samples, and between evaluations (specguard's and promtool's)
INCREMENTS = 64  # samples at 0, 15 s, ... 16 min
T0 = 1_800_000_000.0  # specguard's clock at promtool's time 0

KEY_RULES = """\
rules:
  - name: acceptance_low_for
    signal: acceptance_rate
    window: 1m
    condition: "< 0.5"
    for: 30s
    labels: {team: inference}
  - name: acceptance_keep_firing
    signal: acceptance_rate
    window: 1m
    condition: "< 0.5"
    keep_firing_for: 30s
    severity: critical
  - name: latency_over_baseline
    signal: e2e_latency_p95
    window: 1m
    condition: "> 1.5 * baseline.e2e_latency_p95"
    for: 15s
  - name: acceptance_consecutive
    signal: acceptance_rate
    window: 1m
    condition: "< 0.4"
    consecutive: 3
    severity: critical
"""
# llama is judged by the default entry (p95 > 0.75 s breaches), qwen by its own (p95 > 3 s never
# does, though its latency rises as llama's), and the qwen+vllm-c entry by no series at all.
KEY_BASELINE = {
    "version": 2,
    "measured_at": "2026-11-30T10:00:00Z",
    "entries": [
        {"signals": {"e2e_latency_p95": 0.5}},
        {"model": "qwen", "signals": {"e2e_latency_p95": 2.0}},
        {"model": "qwen", "instance": "vllm-c:8000", "signals": {"e2e_latency_p95": 9.0}},
    ],
}

BUCKETS = ("0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "+Inf")  # vLLM's, cut short


class Server:
    """One synthetic vLLM: counters and a latency histogram that move by phase, increment by increment.

    Per increment (15 s): 20 drafts of 4 tokens, 56 accepted when good (0.7) and 16 when bad (0.2);
    10 requests at 0.4 s when fast and at 2.2 s when slow. Over a 1-minute window (four increments)
    acceptance is 0.7, 0.575, 0.45, 0.325 or 0.2 with 0-4 bad increments, never near 0.5 or 0.4;
    the p95 lies in (0.3, 0.5] with no slow increment and in (2.0, 2.5] with one or more (38 of 40
    ranks), never near 0.75 or 3. Counters start far from zero so that rate()'s extrapolation
    scales every series of a window alike.
    """

    def __init__(self, instance: str, model: str, bad: set[int], slow: set[int]) -> None:
        self.instance, self.model, self.bad, self.slow = instance, model, bad, slow
        self.counters = {
            "vllm:spec_decode_num_drafts_total": 100_000.0,
            "vllm:spec_decode_num_draft_tokens_total": 400_000.0,
            "vllm:spec_decode_num_accepted_tokens_total": 280_000.0,
        }
        self.buckets = {le: 0.0 if le == "0.3" else 10_000.0 for le in BUCKETS}
        self.count, self.total = 10_000.0, 4_000.0
        self.history: dict[str, list[float]] = {}  # exposition series -> value at every sample

    @property
    def target(self) -> str:
        return f"http://{self.instance}/metrics"

    def advance(self, increment: int) -> None:
        self.counters["vllm:spec_decode_num_drafts_total"] += 20
        self.counters["vllm:spec_decode_num_draft_tokens_total"] += 80
        self.counters["vllm:spec_decode_num_accepted_tokens_total"] += 16 if increment in self.bad else 56
        latency = 2.2 if increment in self.slow else 0.4
        for le in BUCKETS:
            if le == "+Inf" or latency <= float(le):
                self.buckets[le] += 10
        self.count += 10
        self.total += 10 * latency

    def samples(self) -> dict[str, float]:
        """name{labels} -> value, with the labels vLLM exports (the scrape adds instance and job)."""
        own = f'engine="0",model_name="{self.model}"'
        out = {f"{name}{{{own}}}": value for name, value in self.counters.items()}
        for le in BUCKETS:
            out[
                f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",model_name="{self.model}"}}'
            ] = self.buckets[le]
        out[f"vllm:e2e_request_latency_seconds_count{{{own}}}"] = self.count
        out[f"vllm:e2e_request_latency_seconds_sum{{{own}}}"] = self.total
        return out

    def page(self) -> str:
        """The /metrics page now, in Prometheus text format, and the sample kept for promtool."""
        lines = []
        for family, kind in (
            ("vllm:spec_decode_num_drafts_total", "counter"),
            ("vllm:spec_decode_num_draft_tokens_total", "counter"),
            ("vllm:spec_decode_num_accepted_tokens_total", "counter"),
            ("vllm:e2e_request_latency_seconds", "histogram"),
        ):
            lines += [f"# HELP {family} synthetic", f"# TYPE {family} {kind}"]
            lines += [
                f"{series} {value!r}" for series, value in self.samples().items() if series.startswith(family)
            ]
        for series, value in self.samples().items():
            self.history.setdefault(series, []).append(value)
        return "\n".join(lines) + "\n"

    def input_series(self) -> list[dict[str, str]]:
        """The same samples as promtool input series, labelled as Prometheus's scrape labels them."""
        out = []
        for series, values in self.history.items():
            name, labels = series.rstrip("}").split("{", 1)
            scrape = f'{labels},instance="{self.instance}",job="vllm"'
            ordered = ", ".join(sorted(scrape.split(",")))
            out.append({"series": f"{name}{{{ordered}}}", "values": " ".join(repr(v) for v in values)})
        return out


def make_servers() -> tuple[Server, ...]:
    """llama: a long bad stretch, a two-increment dip (acceptance 0.45 for three evaluations) and
    two bad increments apart (a breach of two evaluations: pending, never past a 30 s `for`)."""
    return (
        Server("vllm:8000", "llama", bad={*range(9, 21), 31, 32, 41, 43}, slow={*range(15, 31), 45}),
        Server("vllm-b:8000", "qwen", bad={*range(13, 18), *range(50, 54)}, slow=set(range(15, 31))),
    )


Firing = dict[str, dict[int, list[dict[str, str]]]]  # rule -> evaluation time -> firing series' labels


async def specguard_timeline(loaded: Loaded, servers: tuple[Server, ...]) -> Firing:
    """Which series of each rule specguard has firing after each evaluation at 0, 15 s, 30 s...

    Each sample is ingested before the evaluation at its time: promtool's evaluation at t sees the
    sample at t too."""
    clock = Clock(T0)
    source = ScrapeSource([s.target for s in servers], timeout=2.0, retention=600.0, clock=clock)
    states: dict[str, Any] = {item.name: {} for item in loaded.rules}
    firing: Firing = {item.name: {} for item in loaded.rules}
    for step in range(INCREMENTS + 1):
        clock.now = T0 + step * STEP
        for server in servers:
            if step:
                server.advance(step)
            source.ingest(server.target, server.page(), clock.now)
        for item in loaded.rules:
            outcome, result = await evaluate_rule(
                item, source, loaded.baseline, states[item.name], clock.now, STEP
            )
            assert outcome.error is None and not result.invalid, (item.name, step, outcome.error, result)
            states[item.name] = outcome.states
            firing[item.name][step * STEP] = sorted(
                (dict(s.labels) for s in outcome.states.values() if s.state is State.FIRING),
                key=lambda labels: sorted(labels.items()),
            )
    await source.close()
    return firing


def moments(timeline: Mapping[int, list[dict[str, str]]], became: Callable[[bool, bool], bool]) -> list[int]:
    """Times at which some series changed as ``became(was_firing, is_firing)`` says."""
    out, before = [], set[str]()
    for at, series in sorted(timeline.items()):
        now = {json.dumps(s, sort_keys=True) for s in series}
        if any(became(key in before, key in now) for key in before | now):
            out.append(at)
        before = now
    return out


async def test_the_exported_rules_fire_and_resolve_at_the_evaluations_specguard_does(tmp_path: Path) -> None:
    loaded = write_config(
        tmp_path,
        "interval: 15s\nrules: [rules.yaml]\nbaseline: baseline.json\n",
        rules=KEY_RULES,
        baseline=KEY_BASELINE,
    )
    exported = export_rules(loaded, "test")
    assert exported.warnings == [] and exported.skipped == {}
    (tmp_path / "rules.yml").write_text(exported.text)
    checked = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert checked.returncode == 0 and "FAILED" not in checked.stdout, checked.stdout + checked.stderr

    servers = make_servers()
    firing = await specguard_timeline(loaded, servers)
    # Not vacuous: every rule fires and resolves at least once in specguard's own timeline.
    for name, timeline in firing.items():
        fired = moments(timeline, lambda was, now: now and not was)
        resolved = moments(timeline, lambda was, now: was and not now)
        assert fired and resolved, (name, timeline)
    # Each series fires on its own: qwen's latency rises as llama's, but its baseline entry is higher.
    assert {s["model_name"] for t in firing["acceptance_low_for"].values() for s in t} == {"llama", "qwen"}
    assert {s["model_name"] for t in firing["latency_over_baseline"].values() for s in t} == {"llama"}

    extra = {item.name: {**item.rule.labels, "severity": item.rule.severity.value} for item in loaded.rules}
    alert_tests = [
        {
            "eval_time": f"{at}s",
            "alertname": name,
            "exp_alerts": [{"exp_labels": {**labels, **extra[name]}} for labels in series],
        }
        for name, timeline in firing.items()
        for at, series in sorted(timeline.items())
    ]
    test_file = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": f"{STEP}s",
        "tests": [
            {
                "interval": f"{STEP}s",
                "input_series": [series for server in servers for series in server.input_series()],
                "alert_rule_test": alert_tests,
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test_file, sort_keys=False, width=2**31 - 1))
    tested = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert tested.returncode == 0, (
        f"{tested.stdout}{tested.stderr}\nthe rules and the test file are kept in {tmp_path}"
    )
