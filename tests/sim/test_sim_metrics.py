"""The simulator's /metrics has the shape of a real vLLM 0.32.0's (captured in tests/fixtures)."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric

from specguard.store.exposition import parse_exposition
from tests.sim.simclient import (
    FIXTURES,
    chat,
    completion,
    families,
    metrics_text,
    running,
    speculative,
    stream,
)
from tests.vllm_http import PROMETHEUS_ACCEPT

CAPTURES = ["vllm-0.32.0-cpu-metrics-self-draft.prom", "vllm-0.32.0-cpu-metrics-rejecting-draft.prom"]
# Labels whose values are an enumeration fixed by vLLM (not sizes, versions or times).
ENUMERATED = ("engine", "model_name", "finished_reason", "reason", "source", "sleep_state", "position", "le")


def shapes(family: Metric) -> set[tuple[str, frozenset[str]]]:
    """(sample name, label names) of every sample: `_bucket` has `le`, `_count` has not..."""
    return {(sample.name, frozenset(sample.labels)) for sample in family.samples}


def enumerated_values(family: Metric) -> set[tuple[str, str]]:
    return {(k, v) for sample in family.samples for k, v in sample.labels.items() if k in ENUMERATED}


@pytest.mark.parametrize("capture", CAPTURES)
async def test_every_family_of_a_real_vllm_is_there_with_its_type_labels_and_buckets(
    capture: str, session: aiohttp.ClientSession
) -> None:
    theirs = families((FIXTURES / capture).read_text())
    k = len({s.labels["position"] for s in theirs["vllm:spec_decode_num_accepted_tokens_per_pos"].samples})
    async with running(speculative=speculative(k), max_model_len=1024) as sim:
        # The captures saw streamed chat and non-streamed completions: so do we (http_* labels).
        await stream(session, sim, max_tokens=8, stream_options={"include_usage": True})
        await completion(session, sim, max_tokens=8)
        ours = families(await metrics_text(session, sim))

    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"families of vLLM 0.32.0 missing from the simulator: {missing}"
    for name, family in theirs.items():
        assert ours[name].type == family.type, name
        assert shapes(ours[name]) == shapes(family), name
        assert enumerated_values(ours[name]) == enumerated_values(family), name
        assert ours[name].documentation == family.documentation, name


async def test_without_speculative_decoding_there_is_no_spec_decode_family(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=None) as sim:
        await chat(session, sim, max_tokens=8)
        text = await metrics_text(session, sim)
    names = families(text)
    assert "vllm:generation_tokens" in names
    assert not [name for name in names if "spec_decode" in name]


async def test_specguard_reads_the_page_with_its_own_parser(session: aiohttp.ClientSession) -> None:
    async with running(speculative=speculative(3)) as sim:
        await chat(session, sim, max_tokens=8)
        snapshot = parse_exposition(await metrics_text(session, sim))
    assert snapshot["vllm:spec_decode_num_drafts_total"]
    assert snapshot["vllm:e2e_request_latency_seconds_bucket"]


async def test_idle_metrics_have_vllms_idle_values(session: aiohttp.ClientSession) -> None:
    async with running(speculative=speculative(2)) as sim:
        text = await metrics_text(session, sim)
    ours = families(text)
    per_position = ours["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
    assert sorted(s.labels["position"] for s in per_position) == ["0", "1"]  # created at startup
    assert all(s.value == 0 for s in per_position)
    awake = {s.labels["sleep_state"]: s.value for s in ours["vllm:engine_sleep_state"].samples}
    assert awake == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    assert ours["vllm:kv_cache_usage_perc"].samples[0].value == 0.0
    assert not ours["http_requests"].samples  # /metrics itself is not instrumented, as in vLLM


async def test_get_metrics_is_plain_text_with_colons_whatever_the_scraper_asks(
    session: aiohttp.ClientSession,
) -> None:
    """vLLM 0.32 does not negotiate GET /metrics; a simulator that did broke every `vllm:` query of a
    Prometheus 2.x scraping it (prometheus_client bug #1177 writes `vllm_...` sample names)."""
    async with running(speculative=speculative(2)) as sim:
        await chat(session, sim, max_tokens=4)
        answers = []
        for accept in (None, PROMETHEUS_ACCEPT, "application/openmetrics-text; version=1.0.0"):
            headers = {"Accept": accept, "Accept-Encoding": "gzip"} if accept else {}
            async with session.get(sim.url + "/metrics", headers=headers) as response:
                answers.append(
                    (
                        response.headers["Content-Type"],
                        response.headers.get("Content-Encoding"),
                        await response.text(),
                    )
                )
    for content_type, encoding, text in answers:
        assert content_type == "text/plain; version=1.0.0; charset=utf-8"
        assert encoding is None
        assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-llama"}' in text
        assert "vllm_spec_decode" not in text


async def test_other_methods_and_sub_paths_negotiate_as_vllms_mounted_app_does(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(2)) as sim:
        async with session.get(sim.url + "/metrics/", headers={"Accept": PROMETHEUS_ACCEPT}) as response:
            negotiated = (response.headers["Content-Type"], await response.text())
        async with session.post(sim.url + "/metrics") as response:
            posted = response.headers["Content-Type"]
    assert negotiated[0] == "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
    assert "vllm_spec_decode_num_drafts_total" in negotiated[1]  # the bug a real vLLM shows there too
    assert posted == "text/plain; version=0.0.4; charset=utf-8"
