"""The report's traffic by class: the router's series in history, per class and pool, with the
acceptance of the pool each class went to, in the JSON, the Markdown and the HTML."""

from __future__ import annotations

from typing import Any

import pytest

from specguard.report import render
from specguard.report.build import build
from specguard.report.traffic_section import ACCEPTANCE_NOTE
from specguard.store import history
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from tests.router_pages import RouterCounts

T0 = 1_764_000_000.0 - 1_764_000_000.0 % 3600
POOLS = {"speculative": ["s:8000"], "standard": ["t:8001"]}


def server_page(drafts: float, accepted: float, requests: float) -> str:
    return (
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}\n'
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafts * 4}\n'
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {requests}\n'
    )


def standard_page(requests: float) -> str:
    return f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {requests}\n'


async def week(store: Store, router: bool = True) -> None:
    """An hour, scraped each 30 s: per scrape after the first, the router sends 2 `short` requests
    (0.1-0.25 s) to the standard pool and 6 `default` ones to the speculative pool, half of them
    2.5-5 s, half 10-30 s; one body a scrape is not JSON. The speculative server drafts 100
    drafts of 4 tokens a scrape and accepts 240 of them (60 %)."""
    counts = RouterCounts()
    scrapes = []
    for i in range(120):
        at = T0 + 15 + 30 * i
        scrapes.append(("s:8000", at, parse_exposition(server_page(100 * i, 240 * i, 6 * i))))
        scrapes.append(("t:8001", at, parse_exposition(standard_page(2 * i))))
        if router:
            scrapes.append(("r:8081", at, parse_exposition(counts.page())))
        counts.observe("short", "standard", [0.2, 0.15])
        counts.observe("default", "speculative", [3.0, 4.0, 4.5, 12.0, 20.0, 25.0])
        counts.malformed["json"] = counts.malformed.get("json", 0) + 1
    await store.call(lambda db: history.record(db, scrapes))


async def report_of(store: Store, pools: Any = POOLS) -> dict[str, Any]:
    end = T0 + 3600
    return await store.call(lambda db: build(db, T0, end, baseline=None, host="h", now=end, pools=pools))


async def test_each_class_and_pool_has_its_requests_share_latency_and_its_pool_s_acceptance(
    store: Store,
) -> None:
    await week(store)
    report = await report_of(store)
    traffic = report["traffic"]

    assert traffic["routers"] == ["r:8081"]
    # The router's first page has no series yet, its second is their reference: 118 increases.
    assert traffic["requests"] == 118 * 8
    default, short = traffic["classes"]  # most requests first
    assert (default["class"], default["pool"], default["requests"]) == ("default", "speculative", 118 * 6)
    assert (short["class"], short["pool"], short["requests"]) == ("short", "standard", 118 * 2)
    assert default["share"] == pytest.approx(0.75) and short["share"] == pytest.approx(0.25)
    # Prometheus's interpolation: every short request in (0.1, 0.25]; the default ones half in
    # (2.5, 5], half in (10, 30].
    assert short["latency_p50"] == pytest.approx(0.1 + 0.15 * 0.5)
    assert short["latency_p95"] == pytest.approx(0.1 + 0.15 * 0.95)
    assert default["latency_p50"] == pytest.approx(5.0)
    assert default["latency_p95"] == pytest.approx(10 + 20 * 0.9)
    assert default["latency_mean"] == pytest.approx((3.0 + 4.0 + 4.5 + 12.0 + 20.0 + 25.0) / 6)
    assert default["acceptance_rate"] == pytest.approx(0.6)
    assert short["acceptance_rate"] is None  # the standard pool does not speculate
    assert traffic["pools"] == {
        "speculative": {"servers": ["s:8000"], "acceptance_rate": pytest.approx(0.6), "known": True},
        "standard": {"servers": ["t:8001"], "acceptance_rate": None, "known": True},
    }
    assert traffic["malformed"] == {"json": 118}


async def test_the_router_is_not_a_server_section(store: Store) -> None:
    await week(store)
    report = await report_of(store)
    assert [s["instance"] for s in report["series"]] == ["s:8000", "t:8001"]


async def test_without_the_pools_servers_the_acceptance_is_unknown_not_guessed(store: Store) -> None:
    await week(store)
    report = await report_of(store, pools=None)
    assert all(c["acceptance_rate"] is None for c in report["traffic"]["classes"])
    assert {p["known"] for p in report["traffic"]["pools"].values()} == {False}
    markdown = render.markdown(report, {})
    assert markdown.count("servers unknown") == 2


async def test_the_section_in_markdown_and_html(store: Store) -> None:
    await week(store)
    report = await report_of(store)

    markdown = render.markdown(report, {})
    section = markdown.split("## Traffic by class", 1)[1].split("\n## ", 1)[0]
    assert "944 requests through the router (r:8081)" in section
    assert "| default | speculative | 708 | 75.0 % | 5.00 s | 28.00 s | 60.0 % |" in section
    assert "| short | standard | 236 | 25.0 % | 175 ms | 242 ms | no speculation |" in section
    assert ACCEPTANCE_NOTE in section
    assert "speculative: s:8000; standard: t:8001" in section
    assert "not classify (sent to the default pool): json 118" in section
    # after the servers' sections, before the rules
    assert markdown.index("## Traffic by class") < markdown.index("## Rules fired")

    html = render.html(report, {})
    assert "<h2>Traffic by class</h2>" in html and '<td class="l">speculative</td>' in html


async def test_no_router_series_no_section(store: Store) -> None:
    await week(store, router=False)
    report = await report_of(store)
    assert report["traffic"] is None
    assert "Traffic by class" not in render.markdown(report, {})
    assert "Traffic by class" not in render.html(report, {})


def test_the_pools_servers_come_from_the_routing_section_as_the_config_holds_it() -> None:
    from specguard.config.routing import RoutingConfig
    from specguard.report.traffic import pools_of

    routing = RoutingConfig.model_validate(
        {
            "flag_file": "/var/lib/specguard/routing-flag.json",
            "pools": {
                "speculative": {"servers": ["127.0.0.1:8000"]},
                "standard": {"servers": ["10.0.0.2:8001"]},
            },
            "default_pool": "speculative",
            "fallback_pool": "standard",
        }
    )
    assert pools_of(routing) == {"speculative": ("127.0.0.1:8000",), "standard": ("10.0.0.2:8001",)}
    assert pools_of(None) == {}  # a config without a routing section
