"""The baseline per model (and server), version 1 files, and the draft cost behind the speedup estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specguard.config.loading import load
from specguard.store.baseline import HEAD_DRAFT_COST, parse_baseline

M1 = {"instance": "a:8000", "model_name": "llama-70b"}
M1_OTHER_HOST = {"instance": "b:8000", "model_name": "llama-70b"}
M2 = {"instance": "c:8000", "model_name": "qwen-8b"}


def v2(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"version": 2, "measured_at": "2026-11-30T10:00:00Z", "entries": list(entries)}


def test_each_series_uses_the_most_specific_entry_that_fits_its_labels() -> None:
    baseline = parse_baseline(
        v2(
            {"model": "llama-70b", "signals": {"e2e_latency_p95": 1.8}},
            {"model": "llama-70b", "instance": "a:8000", "signals": {"e2e_latency_p95": 2.1}},
            {"signals": {"e2e_latency_p95": 1.0}},
        )
    )
    assert baseline.value(M1, "e2e_latency_p95") == 2.1  # model and instance
    assert baseline.value(M1_OTHER_HOST, "e2e_latency_p95") == 1.8  # model
    assert baseline.value(M2, "e2e_latency_p95") == 1.0  # the default


def test_a_series_no_entry_fits_is_told_why() -> None:
    baseline = parse_baseline(v2({"model": "llama-70b", "signals": {"e2e_latency_p95": 1.8}}))
    assert baseline.value(M2, "e2e_latency_p95") == (
        "the baseline has no entry for model 'qwen-8b' and no default entry"
    )
    assert "no model_name" in str(baseline.value({"instance": "c:8000"}, "e2e_latency_p95"))
    assert (
        baseline.value(M1, "ttft_p95") == "the baseline entry for model llama-70b has no value for 'ttft_p95'"
    )


def test_a_version_1_file_is_one_entry_for_its_model_or_for_every_model() -> None:
    common = {"version": 1, "measured_at": "2026-11-30T10:00:00Z", "signals": {"e2e_latency_p95": 1.84}}
    anyone = parse_baseline(common)
    assert anyone.value(M2, "e2e_latency_p95") == 1.84
    only = parse_baseline({**common, "model": "llama-70b"})
    assert only.value(M1, "e2e_latency_p95") == 1.84
    assert isinstance(only.value(M2, "e2e_latency_p95"), str)  # not another model's p95
    assert parse_baseline({k: v for k, v in common.items() if k != "version"}).version == 1


def test_the_draft_cost_comes_from_the_entry_or_its_method() -> None:
    baseline = parse_baseline(
        v2(
            {"model": "llama-70b", "speculative": {"method": "eagle3"}},
            {"model": "qwen-8b", "speculative": {"method": "ngram"}},
            {"model": "big", "speculative": {"method": "draft_model", "draft_cost": 0.12}},
            {"model": "draft", "speculative": {"method": "draft_model"}},
            {"model": "plain"},
        )
    )
    assert baseline.draft_cost(M1) == HEAD_DRAFT_COST
    assert baseline.draft_cost(M2) == 0.0
    assert baseline.draft_cost({"model_name": "big"}) == 0.12
    assert "set draft_cost" in str(baseline.draft_cost({"model_name": "draft"}))
    assert "says nothing of the speculative method" in str(baseline.draft_cost({"model_name": "plain"}))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (v2({"model": "m", "signals": {}}, {"model": "m", "signals": {}}), "two entries for model m"),
        (v2({"signals": {"e2e_latency_p96": 1.0}}), "unknown signal 'e2e_latency_p96'"),
        (v2({"signals": {"e2e_latency_p95": -1.0}}), "finite number >= 0"),
        (v2({"speculative": {"draft_cost": -0.1}}), "greater than or equal to 0"),
        ({"version": 2, "measured_at": "2026-11-30T10:00:00Z", "entries": []}, "at least 1 item"),
        (v2({"signals_from": "prometheus"}), "'vllm_metrics' or 'client'"),
        (v2({"client": {"e2e_p95": 0.6}}), "unknown client figure 'e2e_p95'"),
        (v2({"client": {"e2e_latency_p95": "fast"}}), "valid number"),
        (v2({"without_speculation": {"speedup": {"ttft": 2.0}}}), "unknown speedup 'ttft'"),
        (v2({"without_speculation": {"url": "http://b:8000"}}), "Extra inputs are not permitted"),
    ],
)
def test_bad_baselines_are_refused_with_the_reason(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_baseline(raw)


def test_check_names_the_baseline_file_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text("baseline: baseline.json\n")
    (tmp_path / "baseline.json").write_text(
        '{"version": 2, "measured_at": "2026-11-30T10:00:00Z",\n'
        ' "entries": [\n'
        '  {"model": "m", "signals": {"e2e_latency_p95": "fast"}}\n'
        " ]}\n"
    )
    loaded = load(tmp_path / "cfg.yaml")
    assert [str(p).split(": ", 1)[0] for p in loaded.errors] == [f"{tmp_path / 'baseline.json'}:3"]
    assert "entries[0].signals.e2e_latency_p95" in str(loaded.errors[0])


OLD_BENCH = {  # what specguard bench wrote before it read vLLM's histograms
    "model": "llama-70b",
    "signals": {"e2e_latency_p95": 0.577, "itl_p50": 0.02},
    "measured_with": "specguard bench: 40 requests, concurrency 2, completions, max_tokens 64",
}


def test_an_entry_from_an_older_bench_works_and_says_it_holds_client_figures_only() -> None:
    baseline = parse_baseline(v2(OLD_BENCH))
    (entry,) = baseline.entries
    assert baseline.value(M1, "e2e_latency_p95") == 0.577  # it keeps working
    assert entry.client_latencies() == ["e2e_latency_p95", "itl_p50"]
    said = entry.client_figures_warning()
    assert said is not None and said.startswith(
        "the baseline entry for model llama-70b holds client figures only"
    )
    assert "`specguard bench --write-baseline`" in said


def test_an_entry_of_histogram_figures_or_written_by_hand_draws_no_warning() -> None:
    now = {**OLD_BENCH, "signals_from": "vllm_metrics", "client": {"e2e_latency_p95": 0.577}}
    by_hand = {"model": "qwen-8b", "signals": {"e2e_latency_p95": 1.8}}
    said_client = {"model": "m", "signals": {"e2e_latency_p95": 1.8}, "signals_from": "client"}
    baseline = parse_baseline(v2(now, by_hand, said_client))
    assert [e.client_latencies() for e in baseline.entries] == [[], [], ["e2e_latency_p95"]]
    # the A/B run's figures are read and kept, never used by a rule
    ab = parse_baseline(v2({**now, "without_speculation": {"signals": {"e2e_latency_mean": 1.2},
                                                        "speedup": {"tpot": 2.1, "e2e": 1.7}}}))  # fmt: skip
    assert ab.entries[0].without_speculation is not None
    assert ab.entries[0].without_speculation.speedup == {"tpot": 2.1, "e2e": 1.7}


def test_check_warns_of_each_client_figure_entry_with_its_line(tmp_path: Path) -> None:
    import json

    (tmp_path / "cfg.yaml").write_text("baseline: baseline.json\nrules: [builtin:speculative]\n")
    now = {"model": "qwen-8b", "signals": {"e2e_latency_p95": 0.78, "e2e_latency_mean": 0.55},
           "signals_from": "vllm_metrics"}  # fmt: skip
    (tmp_path / "baseline.json").write_text(json.dumps(v2(now, OLD_BENCH), indent=1))
    loaded = load(tmp_path / "cfg.yaml")
    assert loaded.ok, [str(p) for p in loaded.errors]
    (warning,) = [p for p in loaded.warnings if p.file.endswith("baseline.json")]
    assert (warning.line, warning.field) == (13, "entries[1]")  # the entry's opening brace
    assert (
        "model llama-70b holds client figures only (e2e_latency_p95, itl_p50 as a client timed them"
        in str(warning)
    )
