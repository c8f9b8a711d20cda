"""n > 1, several prompts in one completion, logprobs, and vLLM's max_tokens defaults."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.sim.simclient import chat, completion, metrics_text, record_of, running, speculative, stream, value


async def test_n_choices_are_n_engine_requests_counted_as_vllm_counts_them(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(3)) as sim:
        done = await completion(
            session, sim, prompt="hello there my friend", max_tokens=6, n=3, ignore_eos=True
        )
        text = await metrics_text(session, sim)
        children = [record_of(sim, f"{done['id']}-{i}") for i in range(3)]

    assert [c["index"] for c in done["choices"]] == [0, 1, 2]
    assert [c["text"] for c in done["choices"]] == ["".join(s.text for s in r.steps) for r in children]
    assert done["usage"]["prompt_tokens"] == children[0].prompt_tokens  # the prompt, counted once
    assert done["usage"]["completion_tokens"] == 18
    assert value(text, "vllm:request_success_total", finished_reason="length") == 3  # one per choice
    assert value(text, "vllm:prompt_tokens_total") == 3 * children[0].prompt_tokens  # each child prefills
    assert value(text, "vllm:request_params_n_count") == 1  # one observation per request...
    assert value(text, "vllm:request_params_n_sum") == 3  # ...of its n
    assert value(text, "vllm:request_max_num_generation_tokens_count") == 1
    assert value(text, "vllm:request_max_num_generation_tokens_sum") == 6


async def test_a_stream_of_n_choices_sends_every_role_first_then_interleaves_them(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(2)) as sim:
        events = await stream(
            session, sim, max_tokens=5, n=2, ignore_eos=True, stream_options={"include_usage": True}
        )

    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    roles = [c for c in chunks if "role" in c["choices"][0].get("delta", {})]
    assert [c["choices"][0]["index"] for c in roles] == [0, 1]
    assert chunks[:2] == roles
    for index in (0, 1):
        own = [c["choices"][0] for c in chunks[2:] if c["choices"][0]["index"] == index]
        assert [c["finish_reason"] for c in own][-1] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 10
    assert events[-1] == "[DONE]"


async def test_several_prompts_get_a_choice_each_and_usage_counts_every_prompt(
    session: aiohttp.ClientSession,
) -> None:
    async with running() as sim:
        done = await completion(session, sim, prompt=["abcd" * 3, "abcd" * 5], max_tokens=2, ignore_eos=True)
    assert [c["index"] for c in done["choices"]] == [0, 1]
    assert done["usage"] == {**done["usage"], "prompt_tokens": 8, "completion_tokens": 4}


def _pieces(logprobs: dict[str, Any]) -> list[str]:
    return [entry["token"] for entry in logprobs["content"]]


async def test_chat_logprobs_cover_every_token_with_the_asked_alternatives(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(4)) as sim:
        done = await chat(session, sim, max_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=3)
        none_asked = await chat(session, sim, max_tokens=2, logprobs=True)
    choice = done["choices"][0]
    assert "".join(_pieces(choice["logprobs"])) == choice["message"]["content"]
    for entry in choice["logprobs"]["content"]:
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["token"] == entry["token"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert entry["bytes"] == list(entry["token"].encode()) and entry["logprob"] < 0
    assert all(entry["top_logprobs"] == [] for entry in none_asked["choices"][0]["logprobs"]["content"])


async def test_completion_logprobs_offsets_point_at_each_token_in_the_text(
    session: aiohttp.ClientSession,
) -> None:
    async with running(speculative=speculative(4)) as sim:
        done = await completion(session, sim, max_tokens=10, ignore_eos=True, logprobs=0)
        events = await stream(session, sim, "/v1/completions", max_tokens=10, ignore_eos=True, logprobs=2)
    choice = done["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == 10
    for offset, token in zip(logprobs["text_offset"], logprobs["tokens"], strict=True):
        assert choice["text"][offset : offset + len(token)] == token
    assert all(
        list(top) == [token] for top, token in zip(logprobs["top_logprobs"], logprobs["tokens"], strict=True)
    )

    streamed = "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"])
    offsets = [o for e in events if isinstance(e, dict) for o in e["choices"][0]["logprobs"]["text_offset"]]
    tokens = [t for e in events if isinstance(e, dict) for t in e["choices"][0]["logprobs"]["tokens"]]
    assert [
        streamed[o : o + len(t)] for o, t in zip(offsets, tokens, strict=True)
    ] == tokens  # offsets run on


async def test_completions_default_to_16_tokens_and_max_tokens_is_cut_to_the_context(
    session: aiohttp.ClientSession,
) -> None:
    async with running(max_model_len=1024) as sim:
        default = await completion(session, sim, ignore_eos=True)
        cut = await completion(session, sim, prompt=[5] * 1000, max_tokens=600, ignore_eos=True)
        chat_default = await chat(session, sim, messages=[{"role": "user", "content": "hi"}], ignore_eos=True)
    assert default["usage"]["completion_tokens"] == 16
    assert cut["usage"] == {**cut["usage"], "prompt_tokens": 1000, "completion_tokens": 24}
    assert chat_default["usage"]["total_tokens"] == 1024  # chat: up to the end of the window
