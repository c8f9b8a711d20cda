"""Prefix caching as vLLM counts it: whole blocks of a shared prompt prefix hit, at least one token is
computed, and the prefix-cache and prompt-by-source counters move together. The numbers below are
the ones a real vLLM 0.32.0 gave for the same shapes of prompts (block size 128: a new 300-token
prompt hits nothing, one sharing 280 tokens with it hits 256, and a 256-token prompt whose two
blocks are cached hits 128)."""

from __future__ import annotations

import aiohttp

from specguard.sim.engine.prefix_cache import PrefixCache, block_hashes
from tests.sim.simclient import completion, metrics_text, record_of, running, value

A = list(range(10, 310))  # 300 tokens
B = list(range(10, 290)) + [7] * 20  # shares 280 tokens with A
C = list(range(10, 266))  # 256 tokens: exactly A's first two blocks


def test_blocks_match_only_with_everything_before_them() -> None:
    cache = PrefixCache(block_size=4, num_blocks=100)
    cache.insert(block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4), free_blocks=100)
    assert cache.lookup(block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4), 9) == 8
    assert cache.lookup(block_hashes([0, 2, 3, 4, 5, 6, 7, 8, 9], 4), 9) == 0  # first block differs
    assert cache.lookup(block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4), 8) == 4  # one token left to compute
    assert block_hashes([1, 2, 3], 4) == []  # no full block


def test_the_least_recently_used_blocks_leave_first_and_disabled_means_no_hits() -> None:
    cache = PrefixCache(block_size=2, num_blocks=10)
    cache.insert(block_hashes([1, 1], 2), free_blocks=10)
    cache.insert(block_hashes([2, 2], 2), free_blocks=10)
    assert cache.lookup(block_hashes([1, 1, 0], 2), 3) == 2  # [1, 1] is now the most recent
    cache.insert(block_hashes([3, 3], 2), free_blocks=2)  # room for two: [2, 2] goes
    assert (cache.lookup(block_hashes([2, 2, 0], 2), 3), cache.lookup(block_hashes([1, 1, 0], 2), 3)) == (
        0,
        2,
    )
    off = PrefixCache(block_size=2, num_blocks=10, enabled=False)
    off.insert(block_hashes([1, 1], 2), free_blocks=10)
    assert off.lookup(block_hashes([1, 1, 0], 2), 3) == 0


async def test_shared_prefixes_hit_whole_blocks_as_in_a_real_vllm(session: aiohttp.ClientSession) -> None:
    async with running(block_size=128, max_model_len=1024) as sim:
        hits = []
        for prompt in (A, B, C):
            before = await metrics_text(session, sim)
            done = await completion(session, sim, prompt=prompt, max_tokens=2)
            after = await metrics_text(session, sim)
            hits.append(
                value(after, "vllm:prefix_cache_hits_total") - value(before, "vllm:prefix_cache_hits_total")
            )
            assert record_of(sim, done["id"]).cached_tokens == hits[-1]
        text = await metrics_text(session, sim)

    assert hits == [0, 256, 128]
    prompt_tokens = len(A) + len(B) + len(C)
    assert value(text, "vllm:prefix_cache_queries_total") == prompt_tokens
    assert value(text, "vllm:prompt_tokens_total") == prompt_tokens
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 384
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == prompt_tokens - 384
    assert value(text, "vllm:prompt_tokens_cached_total") == 384
    assert value(text, "vllm:prompt_tokens_cached_by_source_total", source="device") == 384
    assert value(text, "vllm:request_prefill_kv_computed_tokens_sum") == prompt_tokens - 384


async def test_chats_with_the_same_system_prompt_share_their_prefix(session: aiohttp.ClientSession) -> None:
    system = {"role": "system", "content": "You are a careful assistant who answers briefly. " * 4}
    async with running(block_size=16) as sim:
        for question in ("What is a draft model?", "Why does acceptance fall at high temperature?"):
            body = {"messages": [system, {"role": "user", "content": question}], "max_tokens": 2}
            async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
        text = await metrics_text(session, sim)
    # 4 marker tokens + 200 characters / 4 = 54 tokens of system message: 3 whole blocks of 16.
    assert value(text, "vllm:prefix_cache_hits_total") == 48


async def test_with_prefix_caching_off_nothing_is_looked_up(session: aiohttp.ClientSession) -> None:
    async with running(block_size=16, enable_prefix_caching=False) as sim:
        for _ in range(2):
            await completion(session, sim, prompt=A[:100], max_tokens=2)
        text = await metrics_text(session, sim)
    assert value(text, "vllm:prefix_cache_hits_total") == 0
    assert value(text, "vllm:prefix_cache_queries_total") == 0  # as vLLM: no lookup, no query
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 200
