"""The ``num_speculative_tokens_per_batch_size`` schedule (vLLM 0.25 and later) from a concurrency
sweep: the best measured k at each concurrency, as inclusive batch-size ranges.

A concurrency of N keeps about N requests in each batch, so the k measured best there serves batch
sizes around N. The boundary between two measured levels a < b is their geometric mean (batch sizes
grow by factors, and the step's cost with them); the first range starts at 1, as vLLM requires, and
the last ends at the largest level measured (vLLM carries the last k on to larger batches).
Neighbouring ranges with the same k are merged."""

from __future__ import annotations

import math
from collections.abc import Mapping

# vLLM's first version with num_speculative_tokens_per_batch_size (vllm.md, section 4).
SINCE = (0, 25)


def supported(version: str | None) -> bool:
    if version is None:
        return False
    parts = version.split(".")[:2]
    try:
        return (int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)) >= SINCE
    except (ValueError, IndexError):
        return False


def schedule(best: Mapping[int, int]) -> list[list[int]]:
    """``best``: concurrency -> best k. Returns [[start, end, k], ...]."""
    levels = sorted(best)
    ranges: list[list[int]] = []
    start = 1
    for index, level in enumerate(levels):
        if index + 1 < len(levels):
            end = max(level, math.floor(math.sqrt(level * levels[index + 1])))
        else:
            end = max(level, start)
        if ranges and ranges[-1][2] == best[level]:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, best[level]])
        start = end + 1
    return ranges
