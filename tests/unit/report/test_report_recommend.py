"""The report's recommendations, from series built by hand: which items appear, what they advise, and
the facts their reasoning must show."""

from __future__ import annotations

from typing import Any

import pytest

from specguard.report import recommend
from specguard.report.recommend import recommendations

# EAGLE-1's Vicuna 7B chain draft as vLLM would count it (p_i unconditional).
VICUNA_7B = [0.790, 0.585, 0.421, 0.307, 0.206]


def series(**overrides: Any) -> dict[str, Any]:
    """A healthy week: nothing to recommend but keeping k."""
    base: dict[str, Any] = {
        "instance": "10.0.0.7:8000",
        "model": "llama-70b",
        "k": 5,
        "draft_cost": 0.07,
        "draft_cost_source": "baseline: method eagle3",
        "headline": {
            "acceptance_rate": {"value": 0.46, "previous": 0.46, "change": 0.0},
            "mean_acceptance_length": {"value": 3.31, "previous": 3.31, "change": 0.0},
        },
        "per_position": list(VICUNA_7B),
        "by_day": [
            {"day": f"2026-11-{day}", "acceptance_rate": 0.46, "mean_acceptance_length": 3.31}
            for day in range(23, 30)
        ],
        "by_hour_of_day": [
            {"hour": hour, "acceptance_rate": 0.46, "estimated_speedup": 2.4, "drafts": 5000}
            for hour in range(24)
        ],
        "hourly": [],
        "latency": [{"signal": "ttft_p95", "value": 0.19, "baseline": 0.18, "ratio": 0.19 / 0.18}],
    }
    return {**base, **overrides}


def headline(
    rate: tuple[float | None, float | None], length: tuple[float | None, float | None]
) -> dict[str, Any]:
    return {
        "acceptance_rate": {"value": rate[0], "previous": rate[1]},
        "mean_acceptance_length": {"value": length[0], "previous": length[1]},
    }


def days(*rates: float | None) -> list[dict[str, Any]]:
    return [{"day": f"2026-11-{23 + i}", "acceptance_rate": rate} for i, rate in enumerate(rates)]


def of_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item["kind"] == kind]


def only(items: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (item,) = of_kind(items, kind)
    return item


def text(item: dict[str, Any]) -> str:
    return "\n".join(item["reasoning"])


# --- num_speculative_tokens ------------------------------------------------------------------


def test_a_healthy_week_only_keeps_k() -> None:
    items = recommendations([series()])
    assert [item["kind"] for item in items] == ["num_speculative_tokens"]
    (item,) = items
    assert item["title"] == "keep k = 5"
    assert item["instance"] == "10.0.0.7:8000" and item["model"] == "llama-70b"
    assert item["data"]["recommended_k"] == 5 == item["data"]["best_k"]
    assert "The current k = 5 has the highest expected speedup (2.45)" in text(item)


def test_an_expensive_draft_gets_fewer_tokens_with_the_inputs_formula_and_table_shown() -> None:
    geometric = [0.6, 0.36, 0.216, 0.1296, 0.07776]
    item = only(recommendations([series(per_position=geometric, draft_cost=0.2)]), "num_speculative_tokens")
    assert item["title"] == "set num_speculative_tokens to 2 (now 5)"
    reasoning = item["reasoning"]
    assert "0.6, 0.36, 0.216, 0.13, 0.0778" in reasoning[0]  # p_i at 3 significant digits
    assert reasoning[1] == "Draft cost c = 0.2 (baseline: method eagle3)."
    assert "(1 + Σ_{i<k} p_i) / (1 + k·c)" in reasoning[2]
    assert "k = 2: speedup 1.4 (best)" in reasoning
    assert "k = 5: speedup 1.19 (current)" in reasoning
    assert "k = 6: speedup 1.1 (extrapolated)" in reasoning
    assert "17.5 % faster than the current k = 5" in text(item)
    assert "at least the 3 % a change needs" in text(item)
    data = item["data"]
    assert data["recommended_k"] == 2
    assert data["gain"] == pytest.approx(1.4 / 1.19168 - 1)  # unrounded
    assert data["table"][0] == {"k": 1, "speedup": pytest.approx(1.6 / 1.2), "extrapolated": False}
    assert [row["extrapolated"] for row in data["table"]] == [False] * 5 + [True] * 3


def test_a_gain_under_three_percent_keeps_k_and_says_why() -> None:
    # At c = 0.05 and k = 4, k = 6 would be 2.77 % faster: not worth a restart.
    item = only(recommendations([series(k=4, draft_cost=0.05)]), "num_speculative_tokens")
    assert item["title"] == "keep k = 4"
    assert item["data"]["best_k"] == 6
    assert item["data"]["gain"] == pytest.approx(0.02766, abs=1e-5)
    assert "k = 6 is expected 2.77 % faster than the current k = 4" in text(item)
    assert "under the 3 % a change of k needs" in text(item)


def test_the_gain_threshold_is_the_module_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recommend, "MIN_GAIN_TO_CHANGE_K", 0.02)
    item = only(recommendations([series(k=4, draft_cost=0.05)]), "num_speculative_tokens")
    assert item["title"] == "set num_speculative_tokens to 6 (now 4)"
    assert "at least the 2 % a change needs" in text(item)


def test_more_tokens_past_the_measured_positions_are_flagged_as_extrapolated() -> None:
    item = only(
        recommendations([series(k=3, per_position=[0.9, 0.81, 0.729], draft_cost=0.01)]),
        "num_speculative_tokens",
    )
    assert item["title"] == "set num_speculative_tokens to 8 (now 3)"
    assert "Past k = 3 the p_i are extrapolated: each further position keeps 0.9 of the one before" in text(
        item
    )
    assert "k = 8: speedup 5.67 (extrapolated, best)" in item["reasoning"]
    assert "rests on the extrapolation" in text(item)


def test_a_draft_slower_than_plain_decoding_at_every_k_is_said_so() -> None:
    item = only(
        recommendations([series(k=3, per_position=[0.3, 0.1, 0.03], draft_cost=0.5)]),
        "num_speculative_tokens",
    )
    assert item["title"] == "set num_speculative_tokens to 1 (now 3)"
    assert "Even the best k is estimated slower than plain decoding (speedup 0.867)" in text(item)


def test_an_unknown_draft_cost_asks_for_it_in_the_baseline() -> None:
    item = only(
        recommendations(
            [series(draft_cost=None, draft_cost_source="the baseline gives method 'draft_model'")]
        ),
        "num_speculative_tokens",
    )
    assert item["title"] == "k = 5 cannot be judged without the draft's cost"
    assert "speculative.draft_cost" in text(item)
    assert "the baseline gives method 'draft_model'" in text(item)
    assert item["data"] == {"k": 5, "draft_cost": None, "per_position": VICUNA_7B}


@pytest.mark.parametrize(
    "missing",
    [{"k": None}, {"per_position": []}, {"per_position": None}, {"per_position": [0.8, None, 0.4]}],
    ids=["no k", "no positions", "null positions", "a null position"],
)
def test_no_k_item_without_k_or_complete_per_position_data(missing: dict[str, Any]) -> None:
    assert of_kind(recommendations([series(**missing)]), "num_speculative_tokens") == []


# --- speculation_lost ------------------------------------------------------------------------


def test_hours_estimated_slower_than_plain_decoding_are_named() -> None:
    hours = [
        {"hour": 13, "acceptance_rate": 0.2, "estimated_speedup": 0.912, "drafts": 150000},
        {"hour": 14, "acceptance_rate": 0.25, "estimated_speedup": 0.99},
        {"hour": 15, "acceptance_rate": 0.3, "estimated_speedup": 1.0},  # break-even: not lost
        {"hour": 16, "acceptance_rate": None, "estimated_speedup": None},
    ]
    item = only(recommendations([series(by_hour_of_day=hours)]), "speculation_lost")
    assert item["title"] == "speculation lost: slower than plain decoding at 13:00 UTC, 14:00 UTC on average"
    assert "13:00 UTC: estimated speedup 0.912 (acceptance rate 0.2, drafts 150,000)" in item["reasoning"]
    assert "14:00 UTC: estimated speedup 0.99 (acceptance rate 0.25)" in item["reasoning"]
    assert "15:00" not in text(item)
    assert [hour["hour"] for hour in item["data"]["hours"]] == [13, 14]
    assert item["data"]["latency"] == []


def test_latency_more_than_ten_percent_over_baseline_is_named() -> None:
    latency = [
        {"signal": "ttft_p95", "value": 0.21, "baseline": 0.18, "ratio": 0.21 / 0.18},
        {"signal": "itl_p95", "value": 0.055, "baseline": 0.05, "ratio": 1.10},  # at the limit: fine
        {"signal": "e2e_latency_p95", "value": None, "baseline": 1.8, "ratio": None},
    ]
    item = only(recommendations([series(latency=latency)]), "speculation_lost")
    assert item["title"] == "speculation lost: ttft_p95 above 1.1x baseline"
    assert "ttft_p95 0.21 s against a baseline of 0.18 s: 1.17 times the baseline." in item["reasoning"]
    assert "itl_p95" not in text(item)
    assert item["data"]["latency"] == [latency[0]]
    assert item["data"]["hours"] == []


def test_lost_hours_and_slow_latency_make_one_item_per_series() -> None:
    lost = series(
        by_hour_of_day=[{"hour": 9, "estimated_speedup": 0.8}],
        latency=[{"signal": "itl_p50", "value": 0.03, "baseline": 0.02, "ratio": 1.5}],
    )
    other = series(instance="10.0.0.8:8000", by_hour_of_day=[{"hour": 2, "estimated_speedup": 0.7}])
    items = of_kind(recommendations([lost, other]), "speculation_lost")
    assert [item["instance"] for item in items] == ["10.0.0.7:8000", "10.0.0.8:8000"]
    assert items[0]["title"] == (
        "speculation lost: slower than plain decoding at 09:00 UTC on average; itl_p50 above 1.1x baseline"
    )


def hourly(*speedups: tuple[str, float, int]) -> list[dict[str, Any]]:
    return [{"at": at, "acceptance_rate": 0.3, "estimated_speedup": speedup, "drafts": drafts}
            for at, speedup, drafts in speedups]  # fmt: skip


def test_a_stretch_of_lost_hours_in_the_period_is_named_though_the_hours_average_pays() -> None:
    """A Tuesday afternoon's collapse: each hour of the day still pays on the week's average."""
    lost = series(
        hourly=hourly(
            ("2026-12-01T13:00:00Z", 1.9, 5000),
            ("2026-12-01T14:00:00Z", 0.89, 5000),
            ("2026-12-01T15:00:00Z", 0.95, 5000),
            ("2026-12-01T16:00:00Z", 1.8, 5000),
            ("2026-12-03T02:00:00Z", 0.7, 99),  # a quiet hour's few drafts: not judged
            ("2026-12-04T09:00:00Z", 0.98, 100),
        )
    )
    item = only(recommendations([lost]), "speculation_lost")
    assert item["title"] == (
        "speculation lost: slower than plain decoding on Tue 2026-12-01 14:00-16:00 UTC, "
        "Fri 2026-12-04 09:00-10:00 UTC"
    )
    assert (
        "  2026-12-01T14:00:00Z: estimated speedup 0.89 (acceptance rate 0.3, drafts 5,000)"
        in item["reasoning"]
    )
    assert "2026-12-03T02" not in text(item)
    assert [(span["from"], span["hours"]) for span in item["data"]["spans"]] == [
        ("2026-12-01T14:00:00Z", 2),
        ("2026-12-04T09:00:00Z", 1),
    ]
    assert item["data"]["hours"] == []  # no hour of the day loses on average


def test_no_lost_item_when_every_hour_pays_and_latency_is_near_baseline() -> None:
    assert of_kind(recommendations([series()]), "speculation_lost") == []


# --- draft_degrading -------------------------------------------------------------------------


def test_a_falling_acceptance_rate_with_a_falling_daily_trend_is_degrading() -> None:
    week = series(
        headline=headline(rate=(0.55, 0.62), length=(3.3, 3.4)),
        by_day=days(0.62, 0.6, None, 0.57, 0.55, 0.52),
    )
    item = only(recommendations([week]), "draft_degrading")
    assert item["title"] == "draft acceptance falling: acceptance rate -11.3 % week over week"
    assert "Acceptance rate 0.55 this week against 0.62 the week before: -11.3 %." in item["reasoning"]
    assert (
        "Daily acceptance rate over 5 days: least-squares slope -0.019 per day (falling)."
        in item["reasoning"]
    )
    assert item["data"]["fired_on"] == ["acceptance_rate"]
    assert item["data"]["days"] == 5
    assert item["data"]["daily_slope"] == pytest.approx(-0.326 / 17.2)  # calendar days: 25th missing
    assert item["data"]["acceptance_rate"]["change"] == pytest.approx(0.55 / 0.62 - 1)


def test_a_falling_acceptance_rate_without_a_falling_trend_is_not_degrading() -> None:
    # The fall happened before this week (e.g. a new traffic mix on Monday) and the days are flat or rising.
    week = series(
        headline=headline(rate=(0.55, 0.62), length=(3.3, 3.4)), by_day=days(0.53, 0.55, 0.56, 0.56)
    )
    assert of_kind(recommendations([week]), "draft_degrading") == []


def test_a_trend_needs_three_days_with_data() -> None:
    week = series(headline=headline(rate=(0.55, 0.62), length=(3.3, 3.4)), by_day=days(0.6, None, 0.5))
    assert of_kind(recommendations([week]), "draft_degrading") == []


def test_a_fall_of_five_percent_or_less_is_not_degrading() -> None:
    week = series(headline=headline(rate=(0.6, 0.625), length=(3.3, 3.4)), by_day=days(0.62, 0.61, 0.6, 0.58))
    assert of_kind(recommendations([week]), "draft_degrading") == []  # -4 %


def test_a_falling_mean_acceptance_length_is_degrading_even_with_a_steady_rate() -> None:
    # k went from 5 to 4: the acceptance rate held up only because fewer positions were drafted.
    week = series(k=4, headline=headline(rate=(0.6, 0.6), length=(3.0, 3.4)), by_day=days(0.6, 0.6, 0.6))
    last_week = series(k=5)
    item = only(recommendations([week], previous=[last_week]), "draft_degrading")
    assert item["data"]["fired_on"] == ["mean_acceptance_length"]
    assert item["title"] == "draft acceptance falling: mean acceptance length -11.8 % week over week"
    assert "Mean acceptance length 3 this week against 3.4 the week before: -11.8 %." in item["reasoning"]
    assert "falls when k rises" in text(item)
    assert "k changed from 5 to 4 between the weeks" in text(item)
    assert item["data"]["k_previous"] == 5


def test_both_falls_are_named_in_the_title() -> None:
    week = series(headline=headline(rate=(0.5, 0.6), length=(2.8, 3.2)), by_day=days(0.6, 0.55, 0.5))
    item = only(recommendations([week]), "draft_degrading")
    assert item["data"]["fired_on"] == ["acceptance_rate", "mean_acceptance_length"]
    assert "acceptance rate -16.7 %" in item["title"] and "mean acceptance length -12.5 %" in item["title"]


def test_the_previous_week_comes_from_last_weeks_series_when_the_headline_lacks_it() -> None:
    week = series(headline=headline(rate=(0.5, None), length=(3.0, None)), by_day=days(0.6, 0.55, 0.5))
    last_week = series(headline=headline(rate=(0.6, 0.58), length=(3.1, 3.0)))
    unrelated = series(model="qwen-8b", headline=headline(rate=(0.9, 0.9), length=(5.0, 5.0)))
    item = only(recommendations([week], previous=[unrelated, last_week]), "draft_degrading")
    assert item["data"]["acceptance_rate"] == {"value": 0.5, "previous": 0.6, "change": pytest.approx(-1 / 6)}
    assert item["data"]["mean_acceptance_length"]["previous"] == 3.1
    assert item["data"]["fired_on"] == ["acceptance_rate"]  # 3.0 against 3.1 is -3.2 %


def test_no_degrading_item_without_a_previous_week() -> None:
    week = series(headline=headline(rate=(0.5, None), length=(3.0, None)), by_day=days(0.6, 0.55, 0.5))
    assert of_kind(recommendations([week]), "draft_degrading") == []
    assert of_kind(recommendations([week], previous=[series(model="qwen-8b")]), "draft_degrading") == []


def test_no_series_no_recommendations() -> None:
    assert recommendations([]) == []
    assert recommendations([], previous=[series()]) == []
