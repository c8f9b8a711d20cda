"""RangeSource against a fake Prometheus on loopback: each moment answered from one range query over
the period, on the replay's grid exactly; a bad answer a failed result with the reason, never an
exception. The real Prometheus is in tests/integration/backtest/test_backtest_prometheus.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.backtest.judge import moments
from specguard.backtest.prometheus_range import RangeSource
from specguard.rules.signals import DEFAULT_GROUP_BY, get_signal
from specguard.sources.base import SourceResult

HOUR = 3600.0
START = 1_796_000_400.0  # a whole minute (and hour)
LABELS = {"instance": "vllm-a:8000", "model_name": "model-a"}


def value_at(ms: int) -> float:
    """What the fake's expression is worth at a moment (ms): its seconds into the hour, as a share."""
    return (ms % 3_600_000) / 3_600_000


@dataclass
class FakePrometheus:
    """``/api/v1/query_range`` answering ``value_at`` at each step of the range asked (but ``gaps``),
    or ``answer`` (status, body) when set; ``/api/v1/query`` answering 0.25."""

    url: str = ""
    answer: tuple[int, str] | None = None
    gaps: set[int] = field(default_factory=set)  # moments (ms) with no sample
    ranges: list[dict[str, str]] = field(default_factory=list)  # the range queries' parameters
    instants: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def fake(aiohttp_server: AiohttpServer) -> FakePrometheus:
    fake = FakePrometheus()

    async def query_range(request: web.Request) -> web.Response:
        fake.ranges.append(dict(request.query))
        if fake.answer is not None:
            status, body = fake.answer
            return web.Response(status=status, text=body, content_type="application/json")
        start, end, step = (round(float(request.query[k]) * 1000) for k in ("start", "end", "step"))
        values = [[t / 1000, repr(value_at(t))] for t in range(start, end + 1, step) if t not in fake.gaps]
        result = [{"metric": LABELS, "values": values}]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    async def query(request: web.Request) -> web.Response:
        fake.instants.append(dict(request.query))
        at = float(request.query["time"])
        result = [{"metric": LABELS, "value": [at, "0.25"]}]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_get("/api/v1/query_range", query_range)
    app.router.add_get("/api/v1/query", query)
    server = await aiohttp_server(app, host="127.0.0.1")
    fake.url = f"http://127.0.0.1:{server.port}"
    return fake


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def bound(
    url: str, start: float, end: float, *intervals: float, step: float = 60.0
) -> tuple[RangeSource, Clock]:
    """A RangeSource bound as ``backtest.run`` binds it, to rules of ``intervals``, its step ``step``."""
    source = RangeSource(url, 5.0)
    clock = Clock(start)
    source.bind(clock, [SimpleNamespace(every=i) for i in intervals or (step,)], start, end)
    source.step = step
    return source, clock


async def answers(source: RangeSource, clock: Clock, at: list[float], expr: str = "x") -> list[SourceResult]:
    out = []
    for moment in at:
        clock.at = moment
        out.append(await source.query_expr(expr))
    return out


def only(value: float) -> SourceResult:
    return SourceResult.of([(LABELS, value)])


# --- answers ---------------------------------------------------------------------------------------


async def test_every_moment_is_answered_from_one_range_query(fake: FakePrometheus) -> None:
    end = START + 2 * HOUR
    fake.gaps = {round((START + 600) * 1000)}  # Prometheus had nothing at 00:10
    source, clock = bound(fake.url, START, end)
    grid = moments(START, end - 1e-6, 60.0)
    got = await answers(source, clock, grid)
    await source.close()

    expected = [SourceResult() if at == START + 600 else only(value_at(round(at * 1000))) for at in grid]
    assert got == expected  # the gap is no data, as the instant query there would have said
    assert source.queries == 1 and len(fake.ranges) == 1 and fake.instants == []
    asked = fake.ranges[0]
    assert (asked["query"], asked["start"], asked["end"], asked["step"]) == (
        "x",
        "1796000400",
        "1796007540",
        "60",
    )
    assert asked["timeout"] == "5s"  # Prometheus gives up when the source would


async def test_a_moment_off_the_grid_or_the_period_is_an_instant_query(fake: FakePrometheus) -> None:
    source, clock = bound(fake.url, START, START + HOUR)
    on = await answers(source, clock, [START + 60])
    off = await answers(source, clock, [START + 90, START + HOUR, START - 60])
    await source.close()

    assert on == [only(1 / 60)]
    assert off == [only(0.25)] * 3
    assert [float(q["time"]) for q in fake.instants] == [START + 90, START + HOUR, START - 60]
    assert source.queries == 1


async def test_a_fractional_interval_asks_its_grid_to_the_millisecond(fake: FakePrometheus) -> None:
    # Rounded to whole seconds (the client library's own start and end), the grid of 2.5 s would
    # miss every other moment: each answered as no data.
    start, end = START + 0.3, START + 60
    source, clock = bound(fake.url, start, end, step=2.5)
    grid = moments(start, end - 1e-6, 2.5)
    got = await answers(source, clock, grid)
    await source.close()

    assert grid[0] == START + 2.5 and len(grid) == 23
    assert got == [only(value_at(round(at * 1000))) for at in grid]
    asked = fake.ranges[0]
    assert (asked["start"], asked["end"], asked["step"]) == ("1796000402.500", "1796000457.500", "2.500")
    assert fake.instants == []


async def test_a_rule_replayed_again_after_the_others_asks_a_range_of_its_own_interval(
    fake: FakePrometheus,
) -> None:
    # The calibration replays a 30 s detector after run.py left the step at the last rule's 60 s.
    source, clock = bound(fake.url, START, START + HOUR, 30.0, 60.0, step=60.0)
    grid = moments(START, START + HOUR - 1e-6, 30.0)
    got = await answers(source, clock, grid)
    await source.close()

    assert got == [only(value_at(round(at * 1000))) for at in grid]
    assert fake.instants == []  # not one instant query per 30 s
    assert [q["step"] for q in fake.ranges] == ["60", "30"]  # the first moment is on both grids


async def test_at_start_or_end_is_asked_at_the_moment_not_from_a_range(fake: FakePrometheus) -> None:
    # In a range query @ start() and @ end() are the range's bounds; in the daemon's, the moment.
    source, clock = bound(fake.url, START, START + HOUR)
    got = await answers(source, clock, [START + 60, START + 120], expr="x @ end()")
    await source.close()

    assert got == [only(0.25)] * 2
    assert fake.ranges == [] and [q["query"] for q in fake.instants] == ["x @ end()"] * 2


async def test_a_period_bound_again_is_asked_again(fake: FakePrometheus) -> None:
    source, clock = bound(fake.url, START, START + HOUR)
    first = await answers(source, clock, [START + 60])
    later = START + 5 * HOUR
    source.bind(clock, [SimpleNamespace(every=60.0)], later, later + HOUR)
    second = await answers(source, clock, [later + 60])
    await source.close()

    assert first == [only(value_at(round((START + 60) * 1000)))]
    assert second == [only(value_at(round((later + 60) * 1000)))]
    assert [q["start"] for q in fake.ranges] == ["1796000400", "1796018400"]


# --- bad answers -----------------------------------------------------------------------------------


def matrix(result: Any) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (200, matrix({"x": 1}), "unexpected answer: result is dict"),
        (200, matrix([{"metric": {}, "value": [START, "1"]}]), "unexpected answer: {'metric': {}, 'value'"),
        (200, matrix([{"metric": None, "values": [[START, "1"]]}]), "unexpected answer: {'metric': None"),
        (
            200,
            matrix([{"metric": {}, "values": [[START, "lots"]]}]),
            "unexpected answer: [1796000400.0, 'lots']",
        ),
        (
            200,
            matrix([{"metric": {}, "values": [["1796000400", "1"]]}]),
            "unexpected answer: ['1796000400', '1']",
        ),
        (200, matrix([{"metric": {}, "values": [[START]]}]), "unexpected answer: [1796000400.0]"),
        (200, matrix([{"metric": {}, "values": [[True, "1"]]}]), "unexpected answer: [True, '1']"),
        (200, "<html>sign in</html>", "the answer is not JSON: is this the Prometheus API?"),
        (
            200,
            json.dumps({"status": "success"}),
            "the answer has no data.result: is this the Prometheus API?",
        ),
        (200, "null", "the answer has no data.result: is this the Prometheus API?"),
        (
            400,
            json.dumps({"status": "error", "errorType": "bad_data", "error": "exceeded maximum resolution"}),
            "bad_data: exceeded maximum resolution",
        ),
        (503, "", "HTTP 503"),
    ],
)
async def test_a_bad_answer_is_a_failed_result_with_the_reason(
    fake: FakePrometheus, status: int, body: str, reason: str
) -> None:
    fake.answer = (status, body)
    source, clock = bound(fake.url, START, START + HOUR)
    expr = await answers(source, clock, [START + 60, START + 120])
    signal = await source.query_signal(get_signal("acceptance_rate"), 60.0, DEFAULT_GROUP_BY)
    await source.close()

    said = f"prometheus {fake.url}: {reason}"
    assert [r.error[: len(said)] if r.error else None for r in (*expr, signal)] == [said] * 3
    assert all(r.series == () for r in (*expr, signal))
    # One failed range per query, said at every moment: not asked again at each one.
    assert len(fake.ranges) == source.queries == 2 and fake.instants == []


async def test_a_prometheus_that_is_not_there_is_a_failed_result(unused_tcp_port: int) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    source, clock = bound(url, START, START + HOUR)
    got = await answers(source, clock, [START + 60])
    await source.close()

    assert got == [SourceResult.failed(f"prometheus {url}: connection refused")]
