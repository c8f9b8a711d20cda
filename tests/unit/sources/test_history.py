"""History's per-minute rollups: what a scrape adds, and that nothing is counted twice or lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.store import history
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition

T0 = 1_764_000_000.0 - 1_764_000_000.0 % 60  # a minute's start


def page(
    drafts: float, accepted: float, pos: tuple[float, ...], kv: tuple[float, ...] = (0.5,), **more: float
) -> str:
    lines = [
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}',
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafts * len(pos)}',
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}',
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {v}'
        for i, v in enumerate(pos)
    ]
    lines += [f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {v}' for e, v in enumerate(kv)]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 2' for e in range(len(kv))]
    for reason, value in more.items():
        lines.append(
            f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="m"}} {value}'
        )
    return "\n".join(lines) + "\n"


async def _rows(store: Store, start: float = 0, end: float = 2e10, hours: bool = False) -> list[history.Span]:
    return (await store.call(lambda db: history.read(db, start, end, hours))).get(("a:8000", "m"), [])


async def _record(store: Store, *scrapes: tuple[float, str]) -> None:
    parsed = [("a:8000", at, parse_exposition(text)) for at, text in scrapes]
    await store.call(lambda db: history.record(db, parsed))


async def test_a_scrape_adds_its_increase_to_its_minute_per_position_and_per_finish_reason_summed(
    store: Store,
) -> None:
    await _record(
        store,
        (T0 + 10, page(100, 150, (80, 50, 20), stop=10, length=2)),
        (T0 + 70, page(160, 240, (128, 80, 32), stop=15, length=3)),
    )
    first, second = await _rows(store)
    assert first.start == T0 and "drafts" not in first.parts  # nothing to count from yet
    assert second.start == T0 + 60
    assert second.parts["drafts"] == 60 and second.parts["accepted"] == 90
    assert [second.parts[f"pos:{i}"] for i in range(3)] == [48, 30, 12]
    assert second.parts["requests"] == 6  # 5 stopped + 1 at the length limit


async def test_a_counter_that_went_down_restarted_from_zero_and_counts_whole(store: Store) -> None:
    await _record(store, (T0 + 10, page(1000, 1500, (800,))), (T0 + 20, page(40, 30, (30,))))
    (row,) = await _rows(store)
    assert row.parts["drafts"] == 40 and row.parts["accepted"] == 30


async def test_the_reference_survives_a_restart_and_a_repeated_scrape_is_not_counted_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "specguard.db"
    first = Store(path)
    await first.open()
    await _record(first, (T0 + 10, page(100, 150, (80,))))
    await first.close()
    again = Store(path)  # a new daemon
    await again.open()
    await _record(again, (T0 + 70, page(130, 170, (95,))))
    await _record(again, (T0 + 70, page(130, 170, (95,))))  # the same scrape handed in twice
    rows = await _rows(again)
    await again.close()
    assert rows[-1].parts["drafts"] == 30 and rows[-1].parts["accepted"] == 20


async def test_gauges_add_sum_count_and_keep_the_fullest_engine(store: Store) -> None:
    await _record(
        store,
        (T0 + 10, page(1, 1, (1,), kv=(0.2, 0.9))),
        (T0 + 25, page(1, 1, (1,), kv=(0.4, 0.3))),
    )
    (row,) = await _rows(store)
    assert row.parts["kv:sum"] == pytest.approx(0.9 + 0.4) and row.parts["kv:n"] == 2
    assert row.parts["max:kv"] == 0.9
    assert row.parts["running:sum"] == 8  # two engines of two requests, at two scrapes


async def test_the_old_kv_metric_name_is_the_same_component() -> None:
    old = parse_exposition('vllm:gpu_cache_usage_perc{model_name="m"} 0.7\n')
    assert history.gauges(old)["m"]["max:kv"] == 0.7


async def test_a_window_reads_whole_minutes_from_its_start_up_to_its_end(store: Store) -> None:
    await _record(store, *[(T0 + 60 * i + 5, page(10 * i, 5 * i, (5 * i,))) for i in range(5)])
    rows = await _rows(store, T0 + 60, T0 + 180)
    assert [r.start for r in rows] == [T0 + 60, T0 + 120]


async def test_prune_drops_minutes_past_retention_then_the_oldest_beyond_the_size_bound(store: Store) -> None:
    await _record(store, *[(T0 + 60 * i + 5, page(10 * i, 5 * i, (5 * i,))) for i in range(100)])
    assert await store.call(lambda db: history.prune(db, T0 + 60 * 10, 10**9)) == 10
    assert (await _rows(store))[0].start == T0 + 600
    size = await store.call(history.size)
    await store.call(lambda db: history.prune(db, 0, size // 2))
    left = await _rows(store)
    assert await store.call(history.size) <= size // 2
    assert left[-1].start == T0 + 60 * 99  # the newest stay
    assert len(left) < 90


def test_merge_adds_counts_and_keeps_the_larger_maximum() -> None:
    merged = history.merge({"drafts": 2.0, "max:kv": 0.5}, {"drafts": 3.0, "max:kv": 0.4, "accepted": 1.0})
    assert merged == {"drafts": 5.0, "max:kv": 0.5, "accepted": 1.0}


async def test_a_window_reads_whole_hours_from_their_sums_and_its_edges_minute_by_minute(
    store: Store,
) -> None:
    scrapes = [(T0 + 60 * i + 5, page(10 * i, 7 * i, (5 * i,), kv=(0.1 * (i % 7),))) for i in range(200)]
    await _record(store, *scrapes)
    start, end = T0 + 30 * 60, T0 + 60 * 60 * 3 + 5 * 60  # 00:30 to 03:05: two whole hours inside
    spans = await _rows(store, start, end, hours=True)
    minutes = await _rows(store, start, end, hours=False)
    assert [s.minutes for s in spans] == [1] * 30 + [60, 60] + [1] * 5
    assert sum(s.minutes for s in spans) == len(minutes) == 155
    assert {s.start for s in spans if s.minutes == 60} == {T0 + 3600, T0 + 7200}
    whole: dict[str, float] = {}
    for m in minutes:
        history.merge(whole, m.parts)
    summed: dict[str, float] = {}
    for s in spans:
        history.merge(summed, s.parts)
    assert summed == pytest.approx(whole)


def test_a_counter_that_is_not_a_number_adds_nothing() -> None:
    before = parse_exposition('vllm:spec_decode_num_drafts_total{model_name="m"} 10\n')
    after = parse_exposition('vllm:spec_decode_num_drafts_total{model_name="m"} NaN\n')
    again = parse_exposition('vllm:spec_decode_num_drafts_total{model_name="m"} 25\n')
    assert history.increases(before, after) == {}
    assert history.increases(after, again) == {}
    assert history.increases(before, again) == {"m": {"drafts": 15.0}}


async def test_a_scrape_that_accepted_nothing_still_counts_its_drafts_under_its_k(store: Store) -> None:
    await _record(store, (T0 + 10, page(100, 0, (0, 0, 0))), (T0 + 20, page(160, 0, (0, 0, 0))))
    (row,) = await _rows(store)
    assert row.parts["drafts"] == 60 and row.parts["drafts:k=3"] == 60
    assert "accepted" not in row.parts  # no increase: the report reads it as 0, not as missing


async def test_a_ladder_step_counts_the_drafts_under_each_k(store: Store) -> None:
    await _record(
        store,
        (T0 + 10, page(100, 150, (80, 50, 20))),
        (T0 + 20, page(140, 200, (110, 65, 25))),  # k = 3: 40 drafts
        (T0 + 30, page(10, 12, (8,))),  # restarted with k = 1: 10 drafts
    )
    (row,) = await _rows(store)
    assert row.parts["drafts:k=3"] == 40 and row.parts["drafts:k=1"] == 10 and row.parts["drafts"] == 50


async def test_what_was_counted_over_a_gap_is_spread_over_its_minutes(store: Store) -> None:
    """A daemon down for 10 minutes: the 600 drafts vLLM made meanwhile are 60 a minute, not 600 in
    the minute of the first scrape after it (which would read as ten times the traffic)."""
    await _record(store, (T0, page(1000, 500, (400,))), (T0 + 600, page(1600, 800, (640,))))
    rows = await _rows(store)
    assert [r.start for r in rows] == [T0 + 60 * i for i in range(11)]
    assert [r.parts.get("drafts", 0) for r in rows] == [pytest.approx(60)] * 10 + [0]  # (T0, T0 + 600]
    assert sum(r.parts.get("accepted", 0) for r in rows) == pytest.approx(300)
    assert rows[-1].parts["kv:n"] == 1  # the gauges are the scrape's own, in its minute


async def test_a_gap_that_is_not_on_the_minute_is_shared_by_the_time_in_each_minute(store: Store) -> None:
    await _record(store, (T0 + 30, page(0, 0, (0,))), (T0 + 330, page(300, 0, (0,))))
    rows = await _rows(store)
    drafts = [r.parts.get("drafts", 0) for r in rows]
    assert drafts == [pytest.approx(30), *[pytest.approx(60)] * 4, pytest.approx(30)]


async def test_a_gap_of_more_than_a_day_is_not_kept_and_says_so(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    await _record(store, (T0, page(1000, 500, (400,))), (T0 + 2 * 86400, page(9000, 4000, (3000,))))
    rows = await _rows(store)
    assert [r.start for r in rows] == [T0, T0 + 2 * 86400]
    assert all("drafts" not in r.parts for r in rows)
    assert "48.0 h since its last scrape" in caplog.text
    await _record(store, (T0 + 2 * 86400 + 10, page(9030, 4010, (3008,))))  # counted on from there
    assert (await _rows(store))[-1].parts["drafts"] == 30


async def test_a_sample_that_is_not_a_number_leaves_the_reference_as_it_was(store: Store) -> None:
    nan = page(100, 50, (40,)).replace(" 100\n", " NaN\n", 1)
    await _record(store, (T0 + 10, page(90, 45, (36,))), (T0 + 20, nan), (T0 + 30, page(120, 60, (48,))))
    (row,) = await _rows(store)
    assert row.parts["drafts"] == 30  # 90 -> 120, through the NaN scrape
