"""The baseline per model (and server), version 1 files, and the draft cost behind the speedup estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from daemon.baseline import HEAD_DRAFT_COST, parse_baseline
from daemon.loading import load

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
