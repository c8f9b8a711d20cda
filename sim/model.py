"""The model of speculative decoding the simulator runs: acceptance and step cost.

Leviathan et al.'s model (speculative-math.md section 2), with acceptance allowed to differ per
draft position as EAGLE measures it: in a step with k draft tokens, position i is accepted with
probability ``a_i(T)`` *given positions 0..i-1 were* (a chain draft stops at the first rejection),
and the target adds one token of its own (the bonus), so a step yields ``1 + accepted`` tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def acceptance_at(base: Sequence[float], k: int, temperature: float, decay: float) -> list[float]:
    """Conditional acceptance of positions 0..k-1 at ``temperature``: ``a_i * exp(-decay * T)``.

    ``base`` holds the values at temperature 0; shorter than k, its last value repeats.
    """
    factor = math.exp(-decay * max(temperature, 0.0))
    return [min(1.0, max(0.0, base[min(i, len(base) - 1)] * factor)) for i in range(k)]


def beta_parameters(mean: float, spread: float) -> tuple[float, float]:
    """Beta(a, b) with this mean and standard deviation. Raises ValueError when no Beta has them
    (the spread must stay below sqrt(mean (1 - mean)))."""
    if not 0 < mean < 1 or spread <= 0 or spread * spread >= mean * (1 - mean):
        raise ValueError(
            f"no Beta distribution has mean {mean:g} and spread {spread:g}: the spread must be "
            f"above 0 and below sqrt(mean (1 - mean)) = {math.sqrt(max(mean * (1 - mean), 0.0)):.3f}"
        )
    concentration = mean * (1 - mean) / (spread * spread) - 1
    return mean * concentration, (1 - mean) * concentration


def request_factor(rng: random.Random, mean: float, spread: float) -> float:
    """How much one request's acceptance differs from the configured level: its own level, drawn
    from a Beta with mean ``mean`` and standard deviation ``spread``, over ``mean``. Requests differ
    (prompt, domain, sampling), which is why a window's tokens are not independent trials; 1.0
    (every request alike) without a spread."""
    if spread <= 0 or not 0 < mean < 1:
        return 1.0
    a, b = beta_parameters(mean, spread)
    return rng.betavariate(a, b) / mean


def sample_accepted(rng: random.Random, conditional: Sequence[float]) -> int:
    """Accepted draft tokens in one step: positions are tried in order until one is rejected."""
    accepted = 0
    for probability in conditional:
        if rng.random() >= probability:
            break
        accepted += 1
    return accepted


def step_seconds(
    step_time: float,
    k: int,
    draft_cost: float,
    batch_slowdown: float,
    running: int,
    prefill_tokens: int,
    prefill_tokens_per_step: int,
    verify_token_cost: float = 0.0,
) -> float:
    """Wall time of one engine step.

    Decode is ``step_time * (target + k * c * memory)`` with ``memory = 1 + batch_slowdown *
    (running - 1)`` and ``target = max(memory, verify_token_cost * running * (k + 1))``: k draft
    steps at c each, and one target step verifying k + 1 tokens of every running request.

    The target's step is a roofline. While decode is memory-bound it costs reading the weights once
    and each sequence's KV cache (``memory``: a batch slows every step a little per extra sequence),
    whatever the tokens per sequence, so verifying k + 1 tokens costs one target step (Leviathan's
    cost model). Its arithmetic grows with the tokens it processes, ``running * (k + 1)``, each
    ``verify_token_cost`` of a step; once that exceeds the memory time the step is compute-bound
    and every drafted token verified costs its share, so the best k falls as batches grow (and
    plain decoding, k = 0, slows down too at a batch of ``1 / verify_token_cost`` and more). With
    ``verify_token_cost`` 0 (the default) decode is never compute-bound: ``step_time * (1 + k c) *
    memory``. Prompts prefilled in this step add ``step_time * prefill_tokens /
    prefill_tokens_per_step`` (compute-bound work proportional to the prompt length).
    """
    memory = 1 + batch_slowdown * max(running - 1, 0)
    compute = verify_token_cost * running * (k + 1)
    if compute <= memory:
        decode = step_time * (1 + k * draft_cost) * memory
    else:
        decode = step_time * (compute + k * draft_cost * memory)
    return decode + step_time * prefill_tokens / prefill_tokens_per_step


def natural_length(rng: random.Random, mean: float) -> int:
    """How many tokens a response runs to its EOS: geometric with the given mean (>= 1)."""
    if mean <= 1:
        return 1
    # Inverse CDF of the geometric distribution on 1, 2, ... with success probability 1/mean.
    p = 1.0 / mean
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
