"""Parsing vLLM's /metrics text into the compact snapshot the scrape source keeps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specguard.store.exposition import catalog_sample_names, parse_exposition

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
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
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:request_time_per_output_token_seconds_sum",
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


# --- the same snapshot as prometheus_client's full parse -----------------------------------------


def full_parse(
    text: str, keep: frozenset[str] | None = None
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The reference: every family parsed by prometheus_client, then the wanted samples kept."""
    wanted = catalog_sample_names() if keep is None else keep
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and not sample.name.endswith("_created"):
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = float(sample.value)
    return out


@pytest.mark.parametrize("text", [SELF_DRAFT, REJECTING], ids=["self-draft", "rejecting-draft"])
def test_the_snapshot_of_a_real_page_is_prometheus_clients(text: str) -> None:
    assert parse_exposition(text) == full_parse(text)
    everything = frozenset(s.name for f in text_string_to_metric_families(text) for s in f.samples)
    assert parse_exposition(text, keep=everything) == full_parse(text, everything)


_LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
_LABEL_VALUES = st.text(alphabet=st.sampled_from('ab0 ,={}#"\\\n\t:é'), max_size=8)
_VALUES = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda v: {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}.get(repr(v), repr(v))
    ),
)
_NAMES = st.sampled_from(
    sorted(catalog_sample_names() | {"python_gc_objects_collected_total", "vllm:cache_config_info", "x"})
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def pages(draw: st.DrawFn) -> str:
    """A well-formed page: each family once, its lines together, each series once."""
    lines = []
    for name in draw(st.lists(_NAMES, max_size=12, unique=True)):
        kind = draw(st.sampled_from(["gauge", "counter", "untyped", None]))
        if kind is not None:
            lines.append(f"# HELP {name} help text with \\\\ and \\n escapes")
            lines.append(f"# TYPE {name} {kind}")
        label_sets = draw(
            st.lists(
                st.dictionaries(_LABEL_NAMES.filter(lambda n: n != "__name__"), _LABEL_VALUES, max_size=3),
                min_size=1,
                max_size=4,
                unique_by=lambda labels: tuple(sorted(labels.items())),
            )
        )
        for labels in label_sets:
            order = draw(st.permutations(list(labels.items())))  # any label order
            body = ",".join(f'{k}{draw(st.sampled_from(["=", " = "]))}"{_escape(v)}"' for k, v in order)
            if body and draw(st.booleans()):
                body += ","  # a trailing comma is allowed
            label_text = f"{{{body}}}" if body or draw(st.booleans()) else ""
            space = draw(st.sampled_from([" ", "  ", "\t"]))
            stamp = f" {draw(st.integers(0, 2**40))}" if draw(st.booleans()) else ""
            lines.append(f"{name}{label_text}{space}{draw(_VALUES)}{stamp}")
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\n\n"]))


@given(pages())
@settings(max_examples=200, deadline=None)
def test_the_snapshot_of_any_page_is_prometheus_clients(text: str) -> None:
    try:
        expected = full_parse(text)
    except ValueError:
        return  # a page prometheus_client refuses (a duplicate series, say) is not a comparison
    got = parse_exposition(text)
    assert got.keys() == expected.keys()
    for name, series in expected.items():
        assert got[name].keys() == series.keys(), name
        for labels, value in series.items():
            assert got[name][labels] == value or (math.isnan(value) and math.isnan(got[name][labels]))
