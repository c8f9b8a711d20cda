"""The evidence's three sources give the same spans: history recorded from real scrapes, the raw
series at the window's points from Prometheus (its answers as the API gives them), and a live
scrape of a server whose page changes; plus the files the command line must refuse."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specguard.metrics.figures import figures, total
from specguard.playbook.diagnose import gather
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from specguard.store.history import HOUR, Span, record
from tests.diagnose_parts import MODEL, page


def check(spans: list[Span], drafts: float, accepted: float, peak: float) -> None:
    parts, minutes = total(spans)
    assert parts["drafts"] == drafts and parts["accepted"] == accepted
    assert figures(parts, minutes)["kv_cache_usage_max"] == peak


def test_servers_and_routers_are_told_apart_by_their_components() -> None:
    read = {
        ("10.0.0.7:8000", MODEL): [Span(0, 1, {"drafts": 3.0})],
        ("10.0.0.1:80", ""): [Span(0, 1, {"route:n:spec:chat": 5.0}), Span(60, 1, {"malformed:header": 1.0})],
    }
    servers, routes = gather.split(read)
    assert list(servers) == [("10.0.0.7:8000", MODEL)] and list(routes) == ["10.0.0.1:80"]
    assert len(routes["10.0.0.1:80"]) == 2


def test_spans_from_snapshots_count_a_restart_from_zero() -> None:
    points = [
        (0.0, parse_exposition(page(100, 60, [40, 20], 0.5))),
        (60.0, parse_exposition(page(300, 180, [120, 60], 0.9))),
        (120.0, parse_exposition(page(50, 20, [15, 5], 0.2))),  # vLLM restarted: counted from 0
    ]
    spans = gather.spans_from(points)[MODEL]
    assert [s.start for s in spans] == [0, 60] and all(s.minutes == 1 for s in spans)
    check(spans, 200 + 50, 120 + 20, 0.9)
    assert spans[0].parts["kv:n"] == 2 and spans[1].parts["kv:n"] == 1  # every scrape's gauge, once


def test_the_points_of_a_window_are_its_ends_and_its_whole_hours_or_its_quarters() -> None:
    start = 10 * HOUR + 1800.0
    assert gather.points_in(start, 13 * HOUR) == [start, 11 * HOUR, 12 * HOUR, 13 * HOUR]
    assert gather.points_in(start, start + 3600) == [start + 900.0 * i for i in range(5)]


async def test_history_recorded_from_scrapes_is_read_back(store: Store, tmp_path: Path) -> None:
    t0 = 1_764_900_000 - 1_764_900_000 % HOUR
    scrapes = [("10.0.0.7:8000", t0 + 30.0 * i, parse_exposition(page(100 * i, 50 * i, [30 * i, 20 * i], 0.1 * i)))
               for i in range(1, 6)]  # fmt: skip
    await store.call(lambda db: record(db, scrapes))
    servers, routes, notes = await gather.from_history(store.path, t0, t0 + HOUR)
    assert not routes and not notes
    check(servers[("10.0.0.7:8000", MODEL)], 400, 200, 0.5)
    servers, _, notes = await gather.from_history(store.path, t0 + 2 * HOUR, t0 + 3 * HOUR)
    assert not servers and "no history between" in notes[0]
    servers, _, notes = await gather.from_history(tmp_path / "none.db", t0, t0 + HOUR)
    assert not servers and "no state database" in notes[0]


class FakePrometheus:
    """Prometheus's instant-query answers: each series' value at a time from a timeline."""

    def __init__(self, pages: Mapping[float, str], kv: tuple[float, float, float]) -> None:
        self.pages, self.kv = pages, kv
        self.asked: list[tuple[str, float]] = []

    async def __call__(self, expr: str, at: float) -> list[tuple[Mapping[str, str], float]] | str:
        self.asked.append((expr, at))
        labels = {"instance": "10.0.0.7:8000", "job": "vllm", "model_name": MODEL}
        if expr.startswith("max by"):
            what = expr.split("(", 2)[2].split("_over_time")[0]
            return [(labels, dict(zip(("max", "avg", "count"), self.kv, strict=True))[what])]
        if at not in self.pages:
            return []
        out: list[tuple[Mapping[str, str], float]] = []
        for name, series in parse_exposition(self.pages[at]).items():
            for key, value in series.items():
                out.append(
                    ({**dict(key), "__name__": name, "instance": "10.0.0.7:8000", "job": "vllm"}, value)
                )
        return out


async def test_prometheus_series_at_the_window_points_become_spans() -> None:
    start = 10 * HOUR + 1800.0
    end = 12 * HOUR + 1800.0  # two hours: the points are its whole hours
    pages = {start: page(100, 50, [30, 20], 0), 11 * HOUR: page(700, 350, [210, 140], 0),
             12 * HOUR: page(40, 20, [12, 8], 0), end: page(340, 170, [102, 68], 0)}  # fmt: skip
    query = FakePrometheus(pages, (0.97, 0.5, 120))
    servers, routes, notes = await gather.from_prometheus(query, start, end)
    spans = servers[("10.0.0.7:8000", MODEL)]
    assert [s.start for s in spans] == [start, 11 * HOUR, 12 * HOUR] and [s.minutes for s in spans] == [
        30,
        60,
        30,
    ]
    check(spans, 600 + 40 + 300, 300 + 20 + 150, 0.97)  # vLLM restarted before 12:00: counted from 0
    assert spans[0].parts["kv:sum"] == pytest.approx(60.0) and spans[0].parts["kv:n"] == 120
    assert not notes and not routes
    assert (
        query.asked[0][0].startswith('{__name__=~"')
        and "vllm:spec_decode_num_drafts_total" in query.asked[0][0]
    )
    assert any("[1800s]" in expr for expr, _ in query.asked)


async def test_a_prometheus_error_is_a_note() -> None:
    async def refused(expr: str, at: float) -> list[tuple[Mapping[str, str], float]] | str:
        return "prometheus http://p:9090: connection refused"

    servers, _, notes = await gather.from_prometheus(refused, 0.0, 600.0)
    assert not servers and "connection refused" in notes[0]


async def test_a_live_scrape_sums_the_increases_of_every_scrape() -> None:
    served = iter([page(0, 0, [0, 0], 0.1), page(100, 40, [30, 10], 0.99), page(150, 60, [45, 15], 0.3)] + [page(150, 60, [45, 15], 0.3)] * 50)  # fmt: skip

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=next(served))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app) as server:
        url = str(server.make_url("/metrics"))
        clock = iter(float(t) for t in range(1000, 2000))
        start, end, servers, _, notes = await gather.from_scrape(
            [url], {url: "vllm-a"}, 10.0, 5.0, 2**20, clock=lambda: next(clock), step=0.0
        )
    assert not notes and end > start
    ((key, spans),) = servers.items()
    assert key == ("vllm-a", MODEL) and len(spans) == 1
    check(spans, 150, 60, 0.99)


def test_a_bench_file_that_is_not_a_bench_result_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(gather.GatherError, match=r"--bench .*missing.json: No such file"):
        gather.load_bench(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"phases":\n  {')
    with pytest.raises(
        gather.GatherError, match=r"broken.json: line 2: not a `specguard bench --json` result"
    ):
        gather.load_bench(broken)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"version": 2}))
    with pytest.raises(gather.GatherError, match="no `phases` mapping"):
        gather.load_bench(other)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"phases": {"chat": {}}}))
    assert gather.load_bench(good) == {"phases": {"chat": {}}}


async def test_a_target_that_cannot_be_scraped_is_a_note_without_its_credentials(
    unused_tcp_port: int,
) -> None:
    url = f"http://ops:s3cret@127.0.0.1:{unused_tcp_port}/metrics"
    clock = iter(float(t) for t in range(1000, 2000))
    _, _, servers, _, notes = await gather.from_scrape(
        [url], {}, 10.0, 1.0, 2**20, clock=lambda: next(clock), step=0.0
    )
    assert not servers
    assert notes[0].startswith(f"scraping http://127.0.0.1:{unused_tcp_port}/metrics: ")
    assert "fewer than two scrapes" not in " ".join(notes) and not any("s3cret" in note for note in notes)
