"""Automatic prefix caching, as vLLM V1 counts it (``vllm/v1/core/kv_cache_manager.py``).

A prompt is cut into blocks of ``block_size`` tokens; each *full* block is identified by a hash of
its tokens chained to the hash of the block before it, so a block matches only when everything
before it matches too. When a request is first scheduled, the longest run of its leading blocks
found in the cache is a hit, capped so that at least one prompt token is computed (vLLM needs the
last token's logits): a 256-token prompt whose two blocks of 128 are cached hits 128 tokens, not 256.
Every new request counts its prompt tokens as queries and its hit tokens as hits; a request
re-scheduled after preemption is not counted again.

Blocks enter the cache when their prompt has been prefilled and leave it least recently used first.
Simplified: the cache holds at most the blocks the KV cache has free (capacity minus what running
requests hold), and shared blocks are not deduplicated in the usage figure.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of every full block of ``token_ids``."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class PrefixCache:
    def __init__(self, block_size: int, num_blocks: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enabled = enabled
        self._blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Tokens of a ``num_tokens``-token prompt (with these block ``hashes``) already cached."""
        if not self.enabled:
            return 0
        usable = (num_tokens - 1) // self.block_size  # at least one token must be computed
        hit = 0
        for block in hashes[:usable]:
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            hit += 1
        return hit * self.block_size

    def insert(self, hashes: Sequence[int], free_blocks: int) -> None:
        """Cache a prefilled prompt's blocks, then evict down to ``free_blocks``."""
        if not self.enabled:
            return
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        self.evict(free_blocks)

    def evict(self, free_blocks: int) -> None:
        """Drop least recently used blocks until at most ``free_blocks`` are cached."""
        while len(self._blocks) > max(free_blocks, 0):
            self._blocks.popitem(last=False)
