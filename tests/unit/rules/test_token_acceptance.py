"""token_acceptance through the scrape source: the chain model's α̂ from vLLM's counters, the same
at every k, windows that tile the counters, and drafts shorter than k refused as biased."""

from __future__ import annotations

import random

import pytest

from specguard.rules.signals import DEFAULT_GROUP_BY, get_signal
from specguard.sources.scrape import ScrapeSource

TARGET = "http://10.0.0.7:8000/metrics"
SIGNAL = get_signal("token_acceptance")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def page(totals: dict[str, float], per_pos: list[float], draft_tokens: float | None = None) -> str:
    """A vLLM 0.32 /metrics page holding the speculative-decoding counters."""
    labels = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {totals['drafts']}",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} "
        f"{totals['draft_tokens'] if draft_tokens is None else draft_tokens}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {totals['accepted']}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {v}'
        for i, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


def counters(rng: random.Random, alpha: float, k: int, drafts: int) -> tuple[dict[str, float], list[float]]:
    totals = {"accepted": 0.0, "drafts": 0.0, "draft_tokens": 0.0}
    per_pos = [0.0] * k
    for _ in range(drafts):
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        totals["accepted"] += a
        totals["drafts"] += 1
        totals["draft_tokens"] += k
        for i in range(a):
            per_pos[i] += 1
    return totals, per_pos


def add(
    a: tuple[dict[str, float], list[float]], b: tuple[dict[str, float], list[float]]
) -> tuple[dict[str, float], list[float]]:
    return {k: a[0][k] + b[0][k] for k in a[0]}, [x + y for x, y in zip(a[1], b[1], strict=True)]


async def test_alpha_hat_and_its_trials_come_from_the_counter_increases() -> None:
    clock = Clock()
    source = ScrapeSource([TARGET], timeout=1.0, retention=600.0, clock=clock)
    start = ({"accepted": 100.0, "drafts": 50.0, "draft_tokens": 150.0}, [40.0, 35.0, 25.0])
    # 10 drafts of k = 3: accepted 0, 1, 2, 3, 3, 3, 2, 1, 0, 3 -> S = 18, F = 6 (the four whole
    # drafts count no failure), positions 8, 6, 4.
    step = ({"accepted": 18.0, "drafts": 10.0, "draft_tokens": 30.0}, [8.0, 6.0, 4.0])
    source.ingest(TARGET, page(*start), 970.0)
    source.ingest(TARGET, page(*add(start, step)), 1000.0)
    result = await source.query_signal(SIGNAL, 60.0, DEFAULT_GROUP_BY)
    (series,) = result.series
    assert series.labels == {"instance": "10.0.0.7:8000", "model_name": "m"}
    assert series.value == pytest.approx(18 / 24)
    assert series.trials == 24
    # vLLM's own rate for the same window: 18 / 30.
    rate = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)
    assert rate.series[0].value == pytest.approx(0.6)


async def test_the_same_draft_quality_reads_the_same_at_k_3_and_5_where_vllms_rate_does_not() -> None:
    values, rates = {}, {}
    for k in (3, 5):
        clock = Clock()
        source = ScrapeSource([TARGET], timeout=1.0, retention=600.0, clock=clock)
        rng = random.Random(k)
        first = counters(rng, 0.7, k, 100)
        source.ingest(TARGET, page(*first), 970.0)
        source.ingest(TARGET, page(*add(first, counters(rng, 0.7, k, 20000))), 1000.0)
        values[k] = (await source.query_signal(SIGNAL, 60.0, DEFAULT_GROUP_BY)).series[0].value
        rates[k] = (
            (await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)).series[0].value
        )
    assert values[3] == pytest.approx(0.7, abs=0.01) and values[5] == pytest.approx(0.7, abs=0.01)
    assert rates[3] == pytest.approx(0.51, abs=0.01) and rates[5] == pytest.approx(0.39, abs=0.01)


async def test_consecutive_windows_tile_the_counters_so_no_draft_is_lost_or_counted_twice() -> None:
    clock = Clock()
    source = ScrapeSource([TARGET], timeout=1.0, retention=600.0, clock=clock)
    rng = random.Random(3)
    total = counters(rng, 0.6, 4, 10)
    first = total
    source.ingest(TARGET, page(*total), 995.0)
    trials = []
    for window in range(6):  # scrapes every 4 s, evaluations every 10 s: edges fall between scrapes
        for scrape in range(1, 4):
            at = 995.0 + window * 10 + scrape * 4 - 2
            total = add(total, counters(rng, 0.6, 4, 30))
            source.ingest(TARGET, page(*total), at)
        clock.now = 1005.0 + window * 10
        (series,) = (await source.query_signal(SIGNAL, 10.0, DEFAULT_GROUP_BY)).series
        assert series.trials is not None
        trials.append(series.trials)
    # Every draft between the first sample and the last evaluation's, once.
    accepted = total[0]["accepted"] - first[0]["accepted"]
    drafts = total[0]["drafts"] - first[0]["drafts"]
    whole = total[1][3] - first[1][3]
    assert sum(trials) == pytest.approx(accepted + drafts - whole)


async def test_drafts_shorter_than_k_are_an_error_saying_the_estimate_is_biased() -> None:
    clock = Clock()
    source = ScrapeSource([TARGET], timeout=1.0, retention=600.0, clock=clock)
    # An ngram proposer at k = 4 that found a match only for 2 or 3 tokens: 10 drafts, 26 tokens.
    start = ({"accepted": 0.0, "drafts": 0.0, "draft_tokens": 0.0}, [0.0] * 4)
    after = ({"accepted": 12.0, "drafts": 10.0, "draft_tokens": 26.0}, [6.0, 4.0, 2.0, 0.0])
    source.ingest(TARGET, page(*start), 970.0)
    source.ingest(TARGET, page(*after), 1000.0)
    result = await source.query_signal(SIGNAL, 60.0, DEFAULT_GROUP_BY)
    assert result.series == ()
    (invalid,) = result.invalid
    assert "token_acceptance is biased here: drafts carry 35% fewer tokens than k" in invalid.reason
    assert "use acceptance_rate" in invalid.reason


async def test_a_window_without_drafts_is_no_data() -> None:
    clock = Clock()
    source = ScrapeSource([TARGET], timeout=1.0, retention=600.0, clock=clock)
    still = ({"accepted": 5.0, "drafts": 5.0, "draft_tokens": 15.0}, [3.0, 1.0, 1.0])
    source.ingest(TARGET, page(*still), 970.0)
    source.ingest(TARGET, page(*still), 1000.0)
    result = await source.query_signal(SIGNAL, 60.0, DEFAULT_GROUP_BY)
    assert result.series == () and result.invalid == () and result.error is None


def test_the_promql_takes_the_last_position_as_the_smallest_count() -> None:
    expr = SIGNAL.promql(60.0, DEFAULT_GROUP_BY)
    assert "min without (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[1m]))" in expr
    assert expr.endswith("> 0)")
