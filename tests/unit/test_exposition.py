"""Parsing vLLM's /metrics text into the compact snapshot the scrape source keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.exposition import catalog_sample_names, parse_exposition

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SELF_DRAFT = (FIXTURES / "vllm-0.32.0-cpu-metrics-self-draft.prom").read_text()
REJECTING = (FIXTURES / "vllm-0.32.0-cpu-metrics-rejecting-draft.prom").read_text()

ENGINE_0 = (("engine", "0"), ("model_name", "tiny-llama"))

CATALOG_SAMPLES_IN_0_32 = {
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
}


def test_prometheus_client_strips_total_from_counter_families_but_not_from_samples() -> None:
    # Why snapshots are keyed by sample name: the family name loses `_total`, the catalog has it.
    drafts = next(f for f in text_string_to_metric_families(SELF_DRAFT) if "num_drafts" in f.name)
    assert drafts.name == "vllm:spec_decode_num_drafts"
    assert {s.name for s in drafts.samples} == {"vllm:spec_decode_num_drafts_total"}


@pytest.mark.parametrize("text", [SELF_DRAFT, REJECTING], ids=["self-draft", "rejecting-draft"])
def test_keeps_exactly_the_catalog_samples_a_0_32_server_exposes(text: str) -> None:
    snapshot = parse_exposition(text)

    assert set(snapshot) == CATALOG_SAMPLES_IN_0_32
    assert set(snapshot) <= catalog_sample_names()


def test_drops_families_the_catalog_does_not_read() -> None:
    snapshot = parse_exposition(SELF_DRAFT)

    for unread in (
        "python_gc_objects_collected_total",
        "process_cpu_seconds_total",
        "vllm:prefix_cache_queries_total",
        "vllm:num_requests_waiting_by_reason",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:iteration_tokens_total_bucket",
        "vllm:cache_config_info",
    ):
        assert unread not in snapshot


def test_created_series_are_never_kept_even_when_asked_for() -> None:
    created = "vllm:spec_decode_num_drafts_created"
    assert f"\n{created}{{" in SELF_DRAFT  # the fixture does expose it

    everything = parse_exposition(SELF_DRAFT)
    asked = parse_exposition(SELF_DRAFT, keep={created, "vllm:spec_decode_num_drafts_total"})

    assert not [name for name in everything if name.endswith("_created")]
    assert set(asked) == {"vllm:spec_decode_num_drafts_total"}


def test_counter_values_and_sorted_label_sets() -> None:
    snapshot = parse_exposition(SELF_DRAFT)

    assert snapshot["vllm:spec_decode_num_drafts_total"] == {ENGINE_0: 245.0}
    assert snapshot["vllm:spec_decode_num_draft_tokens_total"] == {ENGINE_0: 1225.0}
    assert snapshot["vllm:spec_decode_num_accepted_tokens_total"] == {ENGINE_0: 188.0}
    per_position = snapshot["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert per_position == {
        (*ENGINE_0, ("position", str(i))): value for i, value in enumerate([56.0, 33.0, 33.0, 33.0, 33.0])
    }
    for series in snapshot.values():
        for labels in series:
            assert list(labels) == sorted(labels)


def test_positions_follow_num_speculative_tokens() -> None:
    positions = {
        dict(labels)["position"]
        for labels in parse_exposition(REJECTING)["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    }
    assert positions == {"0", "1", "2", "3"}


def test_histograms_keep_every_bucket_with_its_le_label() -> None:
    snapshot = parse_exposition(SELF_DRAFT)

    buckets = {
        dict(labels)["le"]: value
        for labels, value in snapshot["vllm:e2e_request_latency_seconds_bucket"].items()
    }
    assert len(buckets) == 22  # 21 finite bounds + Inf
    assert buckets["0.3"] == 3.0
    assert buckets["0.8"] == 9.0
    assert buckets["+Inf"] == 9.0
    assert snapshot["vllm:e2e_request_latency_seconds_count"] == {ENGINE_0: 9.0}


def test_keep_selects_other_samples() -> None:
    snapshot = parse_exposition(SELF_DRAFT, keep={"vllm:prefix_cache_queries_total"})
    assert list(snapshot) == ["vllm:prefix_cache_queries_total"]


def test_empty_text_is_an_empty_snapshot() -> None:
    assert parse_exposition("") == {}


@pytest.mark.parametrize(
    "text",
    [
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0" 1\n',
        'vllm:num_requests_running{engine="0"} one\n',
        "<html><body>502 Bad Gateway</body></html>\n",
        "# TYPE vllm:num_requests_running\n",
    ],
    ids=["unclosed-labels", "bad-value", "html", "type-without-kind"],
)
def test_malformed_text_raises_a_clear_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not valid Prometheus text exposition"):
        parse_exposition(text)
