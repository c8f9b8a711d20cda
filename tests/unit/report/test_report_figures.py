"""The report's figures from history as vLLM counts: a draft that accepted nothing, a ladder step
inside the period, a daemon that was down for a while."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specguard.report.build import build
from specguard.store import history
from specguard.store.baseline import parse_baseline
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition

T0 = 1_764_000_000.0 - 1_764_000_000.0 % 3600  # an hour's start
COST = 0.1
BASELINE = parse_baseline(
    {"version": 2, "measured_at": "2026-12-01T00:00:00Z",
     "entries": [{"model": "m", "speculative": {"method": "draft_model", "draft_cost": COST}}]}
)  # fmt: skip


def page(drafts: float, accepted_per_pos: tuple[float, ...], requests: float = 0) -> str:
    """A vLLM page whose k is len(accepted_per_pos): drafts, k tokens each, accepted as a prefix."""
    k = len(accepted_per_pos)
    return "".join(
        [
            f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}\n',
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafts * k}\n',
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {sum(accepted_per_pos)}\n',
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {v}\n'
                for i, v in enumerate(accepted_per_pos)
            ),
            f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {requests}\n',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n',
        ]
    )


async def report_of(store: Store, scrapes: list[tuple[float, str]], end: float) -> dict[str, Any]:
    parsed = [("a:8000", at, parse_exposition(text)) for at, text in scrapes]
    await store.call(lambda db: history.record(db, parsed))
    made = await store.call(lambda db: build(db, T0, end, baseline=BASELINE, host="h", now=end))
    (series,) = made["series"]
    return series


async def test_a_draft_that_accepted_nothing_reads_0_and_its_k_is_the_servers(store: Store) -> None:
    series = await report_of(
        store, [(T0 + 5 + 10 * i, page(100 * i, (0, 0, 0, 0))) for i in range(30)], T0 + 3600
    )
    assert series["k"] == 4
    assert series["headline"]["acceptance_rate"]["value"] == 0
    assert series["headline"]["mean_acceptance_length"]["value"] == 1
    assert series["per_position"] == [0, 0, 0, 0]
    # speculation costs 1 + 4 c a token and brings one token: slower than plain decoding
    assert series["headline"]["estimated_speedup"]["value"] == pytest.approx(1 / (1 + 4 * COST))
    assert series["by_day"][0]["acceptance_rate"] == 0


async def test_a_ladder_step_rates_each_position_over_the_drafts_that_had_it(store: Store) -> None:
    """k = 5 for the first half hour, then k = 3 (vLLM restarted: its counters from 0)."""
    before = [(T0 + 60 * i + 1, page(100 * i, (80 * i, 60 * i, 40 * i, 20 * i, 10 * i))) for i in range(31)]
    after = [(T0 + 1860 + 60 * i + 1, page(200 * (i + 1), (100 * (i + 1), 50 * (i + 1), 20 * (i + 1)))) for i in range(29)]  # fmt: skip
    series = await report_of(store, before + after, T0 + 3600)
    d5, d3 = 3000, 200 * 29  # the k = 3 server's first scrape counts whole: a restart from 0
    accepted = [80 * 30 + 100 * 29, 60 * 30 + 50 * 29, 40 * 30 + 20 * 29, 20 * 30, 10 * 30]
    assert series["k"] == 3  # what the server runs now
    assert series["k_share"] == {"3": pytest.approx(d3 / (d3 + d5)), "5": pytest.approx(d5 / (d3 + d5))}
    assert series["per_position"] == pytest.approx(
        [accepted[0] / (d5 + d3), accepted[1] / (d5 + d3), accepted[2] / (d5 + d3), accepted[3] / d5, accepted[4] / d5]
    )  # fmt: skip
    tokens = (d5 + d3) + sum(accepted)  # one token per draft from the target, plus the accepted
    cost = d5 * (1 + 5 * COST) + d3 * (1 + 3 * COST)  # in target steps
    assert series["headline"]["estimated_speedup"]["value"] == pytest.approx(tokens / cost)


async def test_a_day_down_does_not_read_as_a_busy_minute(store: Store) -> None:
    """Two requests a minute, and the daemon away for three hours in the middle: the request rate
    stays 2 a minute, and the hours it missed hold their share."""
    scrapes = [(T0 + 60 * i + 1, page(0, (0,), requests=2 * i)) for i in range(60)]
    scrapes += [
        (T0 + 4 * 3600 + 60 * i + 1, page(0, (0,), requests=2 * (180 + 59) + 2 * i)) for i in range(61)
    ]
    series = await report_of(store, scrapes, T0 + 5 * 3600)
    # 2 a minute (the first minute, with nothing to count from, a little under); had the three
    # hours' requests gone to one minute, 4.9 a minute over the two hours observed
    assert series["headline"]["request_rate"]["value"] == pytest.approx(2 / 60, rel=0.01)
    assert series["minutes"] == 5 * 60


@pytest.mark.parametrize(
    ("alpha", "gamma", "speed"),
    [(0.6, 2, 1.96), (0.7, 3, 2.53), (0.8, 2, 2.44), (0.8, 5, 3.69), (0.9, 2, 2.71), (0.9, 10, 6.86)],
)
async def test_the_reports_speedup_reproduces_table_1_of_leviathan_et_al(
    tmp_path: Any, alpha: float, gamma: int, speed: float
) -> None:
    """Table 1 (c = 0) through the whole report path: vLLM's counters of a draft accepted with
    probability alpha at each position reached, into history, the headline and the k table."""
    free = parse_baseline(
        {"version": 2, "measured_at": "2026-12-01T00:00:00Z",
         "entries": [{"model": "m", "speculative": {"method": "draft_model", "draft_cost": 0.0}}]}
    )  # fmt: skip
    store = Store(tmp_path / "specguard.db")
    await store.open()
    drafts = 1_000_000
    reached = tuple(drafts * alpha ** (i + 1) for i in range(gamma))
    parsed = [
        ("a:8000", T0 + 1, parse_exposition(page(0, (0,) * gamma))),
        ("a:8000", T0 + 31, parse_exposition(page(drafts, reached))),
    ]
    await store.call(lambda db: history.record(db, parsed))
    made = await store.call(lambda db: build(db, T0, T0 + 3600, baseline=free, host="h", now=T0 + 3600))
    await store.close()
    (series,) = made["series"]
    assert round(series["headline"]["estimated_speedup"]["value"], 2) == speed
    (k_item,) = [r for r in made["recommendations"] if r["kind"] == "num_speculative_tokens"]
    assert round(k_item["data"]["table"][gamma - 1]["speedup"], 2) == speed
    assert round(k_item["data"]["current_speedup"], 2) == speed


async def test_firings_are_counted_per_server_and_against_the_period_before(store: Store) -> None:
    def fire(db: Any, at: float, rule: str, labels: dict[str, str]) -> None:
        db.execute(
            "INSERT INTO events (at, rule, series, labels, kind, previous, value, threshold, severity,"
            " summary, annotations, shadow, dry_run) VALUES (?, ?, ?, ?, 'firing', 'pending', 0.3, 0.4,"
            " 'critical', '', '{}', 0, 0)",
            (at, rule, json.dumps(labels), json.dumps(labels)),
        )

    ours = {"instance": "a:8000", "model_name": "m"}
    await store.call(lambda db: fire(db, T0 - 1800, "low", ours))  # the hour before
    await store.call(lambda db: fire(db, T0 + 600, "low", ours))
    await store.call(lambda db: fire(db, T0 + 900, "low", ours))
    await store.call(lambda db: fire(db, T0 + 950, "kv", {"instance": "a:8000"}))  # every model of a:8000
    await store.call(lambda db: fire(db, T0 + 999, "low", {"instance": "b:8000", "model_name": "m"}))
    series = await report_of(store, [(T0 + 5 + 10 * i, page(10 * i, (5 * i,))) for i in range(30)], T0 + 3600)
    assert series["headline"]["firings"] == {"value": 3.0, "previous": 1.0, "change": 2.0}
    made = await store.call(lambda db: build(db, T0, T0 + 3600, baseline=BASELINE, host="h", now=T0 + 3600))
    assert {r["rule"]: (r["fired"], r["fired_previous"]) for r in made["rules"]} == {
        "low": (3, 1),
        "kv": (1, 0),
    }


async def test_each_firing_keeps_what_it_said_and_what_its_resolution_said(store: Store) -> None:
    def event(db: Any, at: float, kind: str, previous: str, value: float, summary: str) -> None:
        db.execute(
            "INSERT INTO events (at, rule, series, labels, kind, previous, value, threshold, severity,"
            " summary, annotations, shadow, dry_run) VALUES (?, 'low', 's', '{}', ?, ?, ?, 0.4,"
            " 'critical', ?, '{}', 0, 0)",
            (at, kind, previous, value, summary),
        )

    await store.call(lambda db: event(db, T0 + 60, "pending", "inactive", 0.3, "0.30 below 0.4: breaching"))
    await store.call(lambda db: event(db, T0 + 600, "firing", "pending", 0.3, "0.30 below 0.4 for 9m"))
    await store.call(lambda db: event(db, T0 + 900, "resolved", "firing", 0.7, "0.70: back at or above 0.4"))
    await store.call(lambda db: event(db, T0 + 1200, "firing", "pending", 0.2, "0.20 below 0.4 for 9m"))
    made = await store.call(lambda db: build(db, T0, T0 + 3600, baseline=BASELINE, host="h", now=T0 + 3600))
    (rule,) = made["rules"]
    assert [(f["message"], f["resolved_message"]) for f in rule["firings"]] == [
        ("0.30 below 0.4 for 9m", "0.70: back at or above 0.4"),
        ("0.20 below 0.4 for 9m", None),  # still firing when the report was made
    ]
