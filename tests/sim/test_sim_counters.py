"""What /metrics counts is exactly what was served and what the engine did (its ground truth)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import aiohttp

from specguard.sim.options import SimOptions
from tests.sim.simclient import (
    chat,
    completion,
    decode_step_costs,
    metrics_text,
    record_of,
    running,
    speculative,
    steps_alone_and_together,
    stream,
    value,
)

MODEL = {"model_name": "tiny-llama"}


async def _mixed_traffic(session: aiohttp.ClientSession, sim: Any) -> list[dict[str, Any]]:
    """Chat and completions, streamed and not, of several lengths; some end at EOS ("stop")."""
    jobs: list[Awaitable[Any]] = []
    for i in range(16):
        params: dict[str, Any] = {"max_tokens": 5 + 7 * i, "temperature": (i % 4) * 0.5}
        if i % 3:
            params["ignore_eos"] = True
        kind = i % 4
        if kind == 0:
            jobs.append(chat(session, sim, **params))
        elif kind == 1:
            jobs.append(completion(session, sim, **params))
        elif kind == 2:
            jobs.append(stream(session, sim, stream_options={"include_usage": True}, **params))
        else:
            jobs.append(
                stream(session, sim, "/v1/completions", stream_options={"include_usage": True}, **params)
            )
    results = await asyncio.gather(*jobs)
    served = []
    for result in results:
        if isinstance(result, list):  # a stream: its usage chunk and finishing chunk
            (usage_chunk,) = [event for event in result if isinstance(event, dict) and "usage" in event]
            (last,) = [
                e for e in result if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"]
            ]
            served.append(
                {
                    "id": usage_chunk["id"],
                    "usage": usage_chunk["usage"],
                    "finish_reason": last["choices"][0]["finish_reason"],
                }
            )
        else:
            served.append(
                {
                    "id": result["id"],
                    "usage": result["usage"],
                    "finish_reason": result["choices"][0]["finish_reason"],
                }
            )
    return served


async def test_served_tokens_and_every_counter_agree_exactly(session: aiohttp.ClientSession) -> None:
    async with running(
        speculative=speculative(4), acceptance_by_position=[0.7], mean_output_tokens=40
    ) as sim:
        served = await _mixed_traffic(session, sim)
        text = await metrics_text(session, sim)
        counters = sim.engine.counters
        records = [record_of(sim, item["id"]) for item in served]

    completion_tokens = sum(item["usage"]["completion_tokens"] for item in served)
    prompt_tokens = sum(item["usage"]["prompt_tokens"] for item in served)
    assert value(text, "vllm:generation_tokens_total", **MODEL) == completion_tokens
    assert value(text, "vllm:prompt_tokens_total", **MODEL) == prompt_tokens
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == prompt_tokens
    assert completion_tokens == sum(r.completion_tokens for r in records) == counters.generation_tokens

    # Spec counters follow vLLM's rules, summed over the ground truth's steps.
    steps = [step for record in records for step in record.steps]
    drafted = [step for step in steps if step.draft_tokens]
    assert value(text, "vllm:spec_decode_num_drafts_total") == len(drafted) == counters.num_drafts
    assert value(text, "vllm:spec_decode_num_draft_tokens_total") == 4 * len(drafted)
    assert value(text, "vllm:spec_decode_num_accepted_tokens_total") == sum(s.accepted for s in drafted)
    for position in range(4):
        reached = sum(1 for s in drafted if s.accepted > position)
        assert (
            value(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(position))
            == reached
        )
    # A step yields 1 + accepted tokens, less only when max_tokens or EOS cuts it.
    for record in records:
        for step in record.steps:
            assert step.tokens <= 1 + step.accepted
        assert [t for t in record.token_times] == sorted(record.token_times)
        assert len(record.token_times) == record.completion_tokens

    reasons = [item["finish_reason"] for item in served]
    assert {"length", "stop"} <= set(reasons)
    for reason in ("length", "stop"):
        assert value(text, "vllm:request_success_total", finished_reason=reason) == reasons.count(reason)
    assert value(text, "vllm:request_success_total", finished_reason="abort") == 0

    # Histograms: one observation per finished request; ITL once per output-producing decode step.
    assert value(text, "vllm:e2e_request_latency_seconds_count") == len(served)
    assert value(text, "vllm:time_to_first_token_seconds_count") == len(served)
    assert value(text, "vllm:request_generation_tokens_sum") == completion_tokens
    assert value(text, "vllm:inter_token_latency_seconds_count") == len(steps) - len(records)
    assert value(text, "vllm:iteration_tokens_total_count") == counters.steps
    assert value(text, "vllm:iteration_tokens_total_sum") == prompt_tokens + completion_tokens
    assert value(text, "vllm:num_requests_running") == 0
    assert value(text, "vllm:num_requests_waiting") == 0
    assert value(text, "vllm:kv_cache_usage_perc") == 0


async def test_a_full_kv_cache_makes_requests_wait_and_preempts_the_newest(
    session: aiohttp.ClientSession,
) -> None:
    # Room for about two requests at a time: the others wait, and running ones that grow get preempted.
    async with running(speculative=speculative(2), max_model_len=128, kv_capacity_tokens=200) as sim:
        jobs = asyncio.gather(*(completion(session, sim, max_tokens=100, ignore_eos=True) for _ in range(5)))
        pages = []
        while not jobs.done():
            pages.append(await metrics_text(session, sim))
            await asyncio.sleep(0.01)
        results = await jobs
        text = await metrics_text(session, sim)
        records = [record_of(sim, r["id"]) for r in results]

    waiting = [value(page, "vllm:num_requests_waiting") for page in pages]
    assert max(waiting) >= 1
    for page in pages:
        assert value(page, "vllm:num_requests_waiting_by_reason", reason="capacity") == value(
            page, "vllm:num_requests_waiting"
        )
        assert value(page, "vllm:kv_cache_usage_perc") <= 1
    assert max(value(page, "vllm:kv_cache_usage_perc") for page in pages) > 0.5
    preemptions = sum(record.preemptions for record in records)
    assert preemptions > 0
    assert value(text, "vllm:num_preemptions_total") == preemptions
    assert value(text, "vllm:request_num_preemptions_sum") == preemptions
    # Preempted requests are recomputed, not lost: every one still gets all its tokens.
    assert all(r["usage"]["completion_tokens"] == 100 for r in results)
    assert value(text, "vllm:generation_tokens_total") == 500


async def test_the_kv_usage_floor_overrides_the_reported_usage(session: aiohttp.ClientSession) -> None:
    async with running() as sim:
        sim.engine.set_kv_usage_floor(0.7)
        floored = value(await metrics_text(session, sim), "vllm:kv_cache_usage_perc")
        sim.engine.set_kv_usage_floor(None)
        cleared = value(await metrics_text(session, sim), "vllm:kv_cache_usage_perc")
    assert (floored, cleared) == (0.7, 0.0)


async def test_a_client_that_goes_away_is_counted_as_an_abort(session: aiohttp.ClientSession) -> None:
    async with running(step_time=0.01) as sim:
        async with session.post(
            sim.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 500},
        ) as response:
            await response.content.readline()  # the first chunk: the request is running
        for _ in range(1000):  # the server notices at its next write (10 s on a busy machine)
            text = await metrics_text(session, sim)
            if value(text, "vllm:request_success_total", finished_reason="abort") == 1:
                break
            await asyncio.sleep(0.01)
        assert value(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert value(text, "vllm:num_requests_running") == 0


async def test_plain_decoding_yields_one_token_per_step(session: aiohttp.ClientSession) -> None:
    async with running(speculative=None) as sim:
        result = await chat(session, sim, max_tokens=12, ignore_eos=True)
        record = record_of(sim, result["id"])
    assert [step.tokens for step in record.steps] == [1] * 12
    assert all(step.draft_tokens == 0 for step in record.steps)


async def test_step_time_follows_the_cost_model() -> None:
    """step_time x (1 + k c) x (1 + batch_slowdown x (running - 1)), as the engine recorded it for
    every step it scheduled (when a busy machine let it run is another matter)."""
    options = SimOptions(
        port=0, step_time=0.01, speculative=speculative(4), draft_cost=0.25, batch_slowdown=0.5, seed=3
    )
    steps = await steps_alone_and_together(options, max_tokens=40)
    costs = decode_step_costs(steps)
    # 10 ms x (1 + 4 x 0.25) = 20 ms alone; x (1 + 0.5 x (n - 1)) with n running
    assert costs <= {(n, round(0.020 * (1 + 0.5 * (n - 1)), 9)) for n in (1, 2, 3)}, costs
    assert {(1, 0.02), (3, 0.04)} <= costs
    prefill_with_decode = [group for group in steps.values() if len({s.draft_tokens for s in group}) > 1]
    assert all(group[0].cost > 0.02 for group in prefill_with_decode)  # a prompt's prefill costs more
