"""Streamed responses: one SSE chunk per engine step, exact usage, and vLLM's chunk shapes."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from specguard.sim.engine.records import RequestRecord
from tests.sim.simclient import FIXTURES, chat, completion, record_of, running, speculative, stream


def _content_chunks(events: list[Any]) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if isinstance(e, dict) and e["choices"] and "role" not in e["choices"][0].get("delta", {})
    ]


def _check_steps(record: RequestRecord, texts: list[str], max_tokens: int) -> None:
    """Chunk i is step i: same text, and its tokens are 1 + accepted, capped at max_tokens."""
    assert texts == [step.text for step in record.steps]
    served = 0
    for step in record.steps:
        assert step.tokens == min(1 + step.accepted, max_tokens - served)
        served += step.tokens
    assert served == record.completion_tokens == max_tokens


async def test_each_chat_chunk_is_one_engine_step_and_the_usage_is_exact(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(4), acceptance_by_position=[0.8]) as sim:
        events = await stream(
            session,
            sim,
            max_tokens=50,
            ignore_eos=True,
            temperature=0,
            stream_options={"include_usage": True},
        )
        record = record_of(sim, events[0]["id"])

    assert events[-1] == "[DONE]"
    role, *content, usage_chunk, _ = events
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [chunk["choices"][0]["delta"]["content"] for chunk in content]
    _check_steps(record, texts, max_tokens=50)
    assert any(step.tokens > 1 for step in record.steps)  # speculation really put several tokens in a chunk
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": record.prompt_tokens,
        "total_tokens": record.prompt_tokens + 50,
        "completion_tokens": 50,
    }


async def test_chunks_have_the_fields_of_a_real_vllm_stream(session: aiohttp.ClientSession) -> None:
    captured = [
        json.loads(block.removeprefix("data: "))
        for block in (FIXTURES / "vllm-0.32.0-chat-stream.sse").read_text().split("\n\n")
        if block.startswith("data: {")
    ]
    async with running(speculative=speculative(2)) as sim:
        events = await stream(
            session, sim, max_tokens=6, ignore_eos=True, stream_options={"include_usage": True}
        )
    ours = [e for e in events if isinstance(e, dict)]

    def keys(chunk: dict[str, Any]) -> tuple[Any, ...]:
        choices = chunk["choices"]
        return (
            sorted(chunk),
            sorted(choices[0]) if choices else None,
            sorted(choices[0]["delta"]) if choices else None,
            sorted(chunk.get("usage", {})),
        )

    # role chunk, a content chunk, the finishing chunk, the usage chunk
    for theirs, mine in (
        (captured[0], ours[0]),
        (captured[1], ours[1]),
        (captured[-2], ours[-2]),
        (captured[-1], ours[-1]),
    ):
        assert keys(mine) == keys(theirs)
    assert ours[0]["id"].startswith("chatcmpl-") and ours[0]["object"] == "chat.completion.chunk"


async def test_completions_stream_without_role_chunk_and_without_usage_unless_asked(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(3)) as sim:
        events = await stream(session, sim, "/v1/completions", max_tokens=30, ignore_eos=True)
        record = record_of(sim, events[0]["id"])
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["object"] == "text_completion" and "usage" not in chunk for chunk in chunks)
    _check_steps(record, [chunk["choices"][0]["text"] for chunk in chunks], max_tokens=30)


async def test_non_streamed_responses_carry_exact_usage_and_the_whole_text(
    session: aiohttp.ClientSession,
) -> None:
    prompt = "x" * 41  # 41 characters: 11 tokens at 4 characters a token
    async with running(speculative=speculative(4)) as sim:
        done = await completion(session, sim, prompt=prompt, max_tokens=33, ignore_eos=True)
        talked = await chat(session, sim, messages=[{"role": "user", "content": "y" * 8}], max_tokens=9)
        done_record, talked_record = record_of(sim, done["id"]), record_of(sim, talked["id"])
    assert done["object"] == "text_completion"
    assert done["usage"] == {
        "prompt_tokens": 11,
        "total_tokens": 44,
        "completion_tokens": 33,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert done["choices"][0]["text"] == "".join(step.text for step in done_record.steps)
    # chat: 2 tokens of content + 4 for the message's template markers + 3 for the reply header
    assert talked["usage"]["prompt_tokens"] == 9
    assert talked["usage"]["completion_tokens"] == talked_record.completion_tokens
    assert talked["choices"][0]["message"]["role"] == "assistant"


async def test_a_response_ends_at_eos_with_finish_reason_stop(session: aiohttp.ClientSession) -> None:
    async with running(mean_output_tokens=3, seed=2) as sim:
        events = await stream(session, sim, max_tokens=200, stream_options={"include_usage": True})
        record = record_of(sim, events[0]["id"])
    finishing = [
        e for e in events if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"]
    ]
    assert [e["choices"][0]["finish_reason"] for e in finishing] == ["stop"]
    assert record.finish_reason == "stop" and record.completion_tokens < 200
    assert events[-2]["usage"]["completion_tokens"] == record.completion_tokens  # EOS counts, as in vLLM


async def test_seeded_simulators_generate_the_same_text(session: aiohttp.ClientSession) -> None:
    texts = []
    for _ in range(2):
        async with running(seed=42) as sim:
            texts.append((await chat(session, sim, max_tokens=20))["choices"][0]["message"]["content"])
    assert texts[0] == texts[1] and texts[0].strip()
