"""The Prometheus source against a real Prometheus scraping a replayed vLLM 0.32.0 capture, and
against small fake servers for the failures a real Prometheus will not produce on demand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.config.loading import LoadedRule
from specguard.daemon.evaluation import evaluate_rule
from specguard.rules.matchers import Matcher
from specguard.rules.router_signals import ROUTER_SIGNALS
from specguard.rules.schema import Rule
from specguard.rules.signals import CATALOG, DEFAULT_GROUP_BY, Kind, get_signal
from specguard.sources.base import SourceResult
from specguard.sources.prometheus import PrometheusSource
from specguard.store.records import Verdict
from tests.replay import (
    ACCEPTED,
    ACCEPTED_BY_POSITION,
    CAPTURE,
    DRAFT_TOKENS,
    DRAFTS,
    MODEL,
    SAMPLE,
    ReplayedVllm,
    histogram_quantile,
)
from tests.router_pages import RouterCounts

# The vLLM signals: the router's read its own page (tests/unit/sources/test_router_target.py).
VLLM_SIGNALS = {name: s for name, s in CATALOG.items() if s not in ROUTER_SIGNALS}

if TYPE_CHECKING:  # fixture types; conftest is not imported at run time
    from conftest import MetricsServer, PrometheusServer

WINDOW = 30.0
DATA_TIMEOUT = 30.0
GROUPINGS: tuple[Sequence[str], ...] = (DEFAULT_GROUP_BY, (), ("engine",))


async def wait_for_data(query: Callable[[], Awaitable[SourceResult]], series: int = 1) -> SourceResult:
    """Poll until Prometheus has scraped enough for the query to answer (rate() needs two)."""
    deadline = time.monotonic() + DATA_TIMEOUT
    while True:
        result = await query()
        assert result.error is None, result.error
        if len(result.series) >= series:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"no data from Prometheus after {DATA_TIMEOUT}s")
        await asyncio.sleep(0.5)


@pytest.fixture
async def source(prometheus: PrometheusServer) -> AsyncIterator[PrometheusSource]:
    src = PrometheusSource(prometheus.url, timeout=5.0)
    yield src
    await src.close()


async def fake_prometheus(aiohttp_server: AiohttpServer, handler: web.Handler) -> str:
    app = web.Application()
    app.router.add_get("/api/v1/query", handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


# --- against a real Prometheus ---------------------------------------------------------------


@pytest.mark.real
async def test_spec_decode_signals_equal_the_served_counter_deltas(
    metrics_server: MetricsServer, source: PrometheusSource
) -> None:
    metrics_server.body = ReplayedVllm()
    by_position = await wait_for_data(
        lambda: source.query_signal(get_signal("acceptance_by_position"), WINDOW, DEFAULT_GROUP_BY),
        series=len(ACCEPTED_BY_POSITION),
    )
    rate = await source.query_signal(get_signal("acceptance_rate"), WINDOW, DEFAULT_GROUP_BY)
    length = await source.query_signal(get_signal("mean_acceptance_length"), WINDOW, DEFAULT_GROUP_BY)

    server = {"instance": metrics_server.target, "model_name": MODEL}
    assert [(s.labels, s.value) for s in rate.series] == [
        (server, pytest.approx(ACCEPTED / DRAFT_TOKENS, rel=1e-9))
    ]
    assert [(s.labels, s.value) for s in length.series] == [
        (server, pytest.approx(1 + ACCEPTED / DRAFTS, rel=1e-9))
    ]
    assert {s.labels["position"]: s.value for s in by_position.series} == {
        position: pytest.approx(count / DRAFTS, rel=1e-9) for position, count in ACCEPTED_BY_POSITION.items()
    }
    assert all(s.labels == {**server, "position": s.labels["position"]} for s in by_position.series)


@pytest.mark.real
async def test_label_matchers_select_series_in_promql_as_in_the_scrape_source(
    metrics_server: MetricsServer, source: PrometheusSource
) -> None:
    metrics_server.body = ReplayedVllm(engines=2)
    per_position = get_signal("acceptance_by_position")
    first = (Matcher("position", "=", "0"),)
    await wait_for_data(lambda: source.query_signal(per_position, WINDOW, DEFAULT_GROUP_BY, first, False))
    alone = await source.query_signal(per_position, WINDOW, DEFAULT_GROUP_BY, first, keep_intrinsic=False)
    deep = await source.query_signal(
        per_position, WINDOW, DEFAULT_GROUP_BY, (Matcher("position", "=~", "[34]"),)
    )
    one_engine = await source.query_signal(
        get_signal("mean_acceptance_length"), WINDOW, DEFAULT_GROUP_BY, (Matcher("engine", "!=", "1"),)
    )

    server = {"instance": metrics_server.target, "model_name": MODEL}
    assert [(s.labels, s.value) for s in alone.series] == [
        (server, pytest.approx(ACCEPTED_BY_POSITION["0"] / DRAFTS, rel=1e-9))
    ]
    assert {s.labels["position"]: s.value for s in deep.series} == {
        p: pytest.approx(ACCEPTED_BY_POSITION[p] / DRAFTS, rel=1e-9) for p in ("3", "4")
    }
    assert [s.value for s in one_engine.series] == [pytest.approx(1 + ACCEPTED / DRAFTS, rel=1e-9)]


def short_drafts(replay: ReplayedVllm, carried: int) -> Callable[[], str]:
    """The replay as an ngram proposer's server: its drafts carry ``carried`` tokens a scrape
    instead of DRAFTS x k (a prompt without a long enough match gets a shorter draft)."""

    def body() -> str:
        lines = []
        for line in replay().splitlines():
            sample = SAMPLE.match(line)
            if sample is not None and sample[1] == "vllm:spec_decode_num_draft_tokens_total":
                value = float(sample[3]) - replay.progress * (DRAFT_TOKENS - carried)
                line = f"{line[: sample.start(3)]}{value!r}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    return body


@pytest.mark.real
async def test_drafts_shorter_than_k_are_an_error_naming_the_bias_through_prometheus_too(
    metrics_server: MetricsServer, source: PrometheusSource
) -> None:
    # 10 drafts of k = 5 a scrape carrying 35 tokens, not 50: per draft, the missing tokens would
    # read as rejections and token_acceptance as lower than it is.
    metrics_server.body = short_drafts(ReplayedVllm(), carried=35)
    token_acceptance = get_signal("token_acceptance")
    deadline = time.monotonic() + DATA_TIMEOUT
    while not (answer := await source.query_signal(token_acceptance, WINDOW, DEFAULT_GROUP_BY)).invalid:
        assert answer.error is None and answer.series == (), answer
        if time.monotonic() > deadline:
            pytest.fail(f"no data from Prometheus after {DATA_TIMEOUT}s")
        await asyncio.sleep(0.5)
    server = {"instance": metrics_server.target, "model_name": MODEL}
    assert answer.series == () and [i.labels for i in answer.invalid] == [server]
    assert answer.invalid[0].reason.startswith(
        "token_acceptance is biased here: drafts carry 30% fewer tokens than k (an ngram or suffix "
    )
    assert answer.invalid[0].reason.endswith("use acceptance_rate for this server")
    rate = await source.query_signal(get_signal("acceptance_rate"), WINDOW, DEFAULT_GROUP_BY)
    assert [s.value for s in rate.series] == [pytest.approx(ACCEPTED / 35, rel=1e-9)]  # what it advises

    # The collapse detector on the same answer: the series is an error saying so, never judged.
    rule = Rule.model_validate(
        {"name": "collapse", "signal": "token_acceptance", "interval": "10s",
         "detect": {"in_control": 0.75, "drop": 0.2, "phi": 2}}
    )  # fmt: skip
    outcome, _ = await evaluate_rule(LoadedRule(rule, "rules.yaml", 1), source, None, {}, time.time(), 10.0)
    (key,) = outcome.states
    assert outcome.verdicts[key] is Verdict.ERROR
    assert (outcome.states[key].error or "").startswith("token_acceptance is biased here: drafts carry 30%")
    assert outcome.states[key].detector is None  # nothing counted towards G


@pytest.mark.real
async def test_the_router_s_signals_are_promql_that_real_prometheus_evaluates_per_class_and_pool(
    metrics_server: MetricsServer, prometheus: PrometheusServer
) -> None:
    counts = RouterCounts()

    def page() -> str:  # every scrape: 1 short request (0.2 s), 3 default ones (3 s), 1 bad body
        counts.observe("short", "standard", [0.2])
        counts.observe("default", "speculative", [3.0, 3.0, 3.0])
        counts.malformed["json"] = counts.malformed.get("json", 0) + 1
        return counts.page()

    metrics_server.body = page
    waiting = PrometheusSource(prometheus.url, timeout=5.0)
    try:
        await wait_for_data(
            lambda: waiting.query_signal(get_signal("routed_request_rate"), WINDOW, DEFAULT_GROUP_BY),
            series=2,
        )
    finally:
        await waiting.close()
    more = metrics_server.scrapes + 2  # two scrapes more: a moment with both samples rate() needs
    while metrics_server.scrapes < more:
        await asyncio.sleep(0.2)
    at = round(time.time() - 0.5, 3)  # every query at one moment Prometheus has ingested
    source = PrometheusSource(prometheus.url, timeout=5.0, clock=lambda: at)
    try:
        await _router_answers(source, metrics_server.target)
    finally:
        await source.close()


async def _router_answers(source: PrometheusSource, target: str) -> None:
    rate = await source.query_signal(get_signal("routed_request_rate"), WINDOW, DEFAULT_GROUP_BY)
    router = {"instance": target}  # the router's page has no model_name
    rates = {(s.labels["class"], s.labels["pool"]): s.value for s in rate.series}
    assert all(
        s.labels == {**router, "class": s.labels["class"], "pool": s.labels["pool"]} for s in rate.series
    )
    assert set(rates) == {("short", "standard"), ("default", "speculative")}
    assert rates["default", "speculative"] == pytest.approx(3 * rates["short", "standard"], rel=1e-9)
    for name in ("routed_latency_p50", "routed_latency_p95"):
        latency = await source.query_signal(get_signal(name), WINDOW, DEFAULT_GROUP_BY)
        assert latency.error is None and not latency.invalid
        values = {s.labels["class"]: s.value for s in latency.series}
        assert 0.1 < values["short"] <= 0.25 and 2.5 < values["default"] <= 5.0, (name, values)
    malformed = await source.query_signal(get_signal("routed_malformed_rate"), WINDOW, DEFAULT_GROUP_BY)
    ((labels, value),) = [(s.labels, s.value) for s in malformed.series]
    assert labels == {**router, "reason": "json"}
    assert value == pytest.approx(rates["short", "standard"], rel=1e-9)
    by_class = await source.query_signal(
        get_signal("routed_request_rate"), WINDOW, ["class"], keep_intrinsic=False
    )
    assert {s.labels["class"]: s.value for s in by_class.series} == pytest.approx(
        {"short": rates["short", "standard"], "default": rates["default", "speculative"]}, rel=1e-9
    )
    # vLLM's signals read no data from the router's page, and no error
    for name, signal in VLLM_SIGNALS.items():
        if signal.kind is not Kind.SPEEDUP:
            answer = await source.query_signal(signal, WINDOW, DEFAULT_GROUP_BY)
            assert answer.error is None and answer.series == () and answer.invalid == (), name


async def test_every_catalog_signal_is_promql_that_real_prometheus_evaluates(
    metrics_server: MetricsServer, source: PrometheusSource
) -> None:
    metrics_server.body = ReplayedVllm()
    await wait_for_data(lambda: source.query_signal(get_signal("e2e_latency_p95"), WINDOW, DEFAULT_GROUP_BY))
    answers = {
        (name, tuple(group_by)): await source.query_signal(signal, WINDOW, group_by)
        for name, signal in VLLM_SIGNALS.items()
        if signal.kind is not Kind.SPEEDUP  # derived from two of the others
        for group_by in GROUPINGS
    }

    assert {key: result.error for key, result in answers.items() if result.error} == {}
    assert [key for key, result in answers.items() if not result.series] == []
    for (name, group_by), result in answers.items():  # each keeps exactly the labels asked for
        for series in result.series:
            assert set(series.labels) == {*group_by, *CATALOG[name].intrinsic_labels}, name
    quantiles = {
        name: answers[(name, DEFAULT_GROUP_BY)].series[0].value
        for name, signal in VLLM_SIGNALS.items()
        if signal.kind is Kind.QUANTILE
    }
    assert quantiles == {
        name: pytest.approx(
            histogram_quantile(CATALOG[name].quantile or 0, CATALOG[name].metric.names[0]),
            rel=1e-9,
        )
        for name in quantiles
    }
    assert quantiles["e2e_latency_p95"] == pytest.approx(1.75, rel=1e-9)  # 1.5 + 0.5 * (9.5-9)/1


@pytest.mark.real
async def test_an_idle_server_is_no_data_rather_than_nan_or_an_error(
    metrics_server: MetricsServer, source: PrometheusSource
) -> None:
    capture = CAPTURE.read_text()
    metrics_server.body = lambda: capture  # nothing moves: no draft, no request finished
    # A counter rate of 0 is a value: once it shows, rate() has its two samples.
    await wait_for_data(lambda: source.query_signal(get_signal("preemption_rate"), WINDOW, DEFAULT_GROUP_BY))

    for name in ("acceptance_rate", "mean_acceptance_length", "acceptance_by_position", "e2e_latency_p95"):
        result = await source.query_signal(get_signal(name), WINDOW, DEFAULT_GROUP_BY)
        assert result == SourceResult(), name  # the "> 0" filter / NaN quantile: no series


@pytest.mark.real
async def test_query_errors_are_answers_and_unknown_metrics_are_no_data(
    source: PrometheusSource,
) -> None:
    bad = await source.query_expr("sum(rate(")
    missing = await source.query_expr("rate(vllm:nobody_exports_this_total[1m])")
    range_vector = await source.query_expr("vector(1)[1m:10s]")  # has data from the start
    scalar = await source.query_expr("1 + 1")

    assert bad.series == ()
    assert bad.error is not None
    assert bad.error.startswith(f"prometheus {source.url}: bad_data: ")
    assert "parse error" in bad.error
    assert missing == SourceResult()
    assert range_vector.error is not None
    assert "range vector" in range_vector.error
    assert [(s.labels, s.value) for s in scalar.series] == [({}, 2.0)]


# --- failures, against nothing or a fake ----------------------------------------------------


async def test_prometheus_down_is_an_error_at_once(unused_tcp_port: int) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    source = PrometheusSource(url, timeout=2.0)
    result = await source.query_expr("up")
    await source.close()

    assert result == SourceResult.failed(f"prometheus {url}: connection refused")


async def test_a_dropped_connection_is_one_attempt_not_retried() -> None:
    accepted = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    source = PrometheusSource(url, timeout=2.0)
    async with server:
        result = await source.query_expr("up")
    await source.close()

    assert result == SourceResult.failed(f"prometheus {url}: connection closed without an answer")
    assert accepted == 1


async def test_a_503_is_asked_once_not_retried(aiohttp_server: AiohttpServer) -> None:
    hits = 0

    async def unavailable(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        body = {"status": "error", "errorType": "unavailable", "error": "too many queries"}
        return web.json_response(body, status=503)

    url = await fake_prometheus(aiohttp_server, unavailable)
    source = PrometheusSource(url, timeout=2.0)
    result = await source.query_expr("up")
    await source.close()

    assert result == SourceResult.failed(f"prometheus {url}: unavailable: too many queries")
    assert hits == 1  # the client's default would be 4 requests over ~6 s of backoff


async def test_a_hung_prometheus_is_an_error_after_the_timeout(
    aiohttp_server: AiohttpServer,
) -> None:
    server_timeouts: list[str | None] = []

    async def hang(request: web.Request) -> web.Response:
        server_timeouts.append(request.query.get("timeout"))
        await asyncio.sleep(1.5)
        return web.json_response({"status": "success", "data": {"result": []}})

    url = await fake_prometheus(aiohttp_server, hang)
    source = PrometheusSource(url, timeout=0.5)
    started = time.monotonic()
    result = await source.query_expr("up")
    elapsed = time.monotonic() - started
    await source.close()

    # The server would have answered "success" at 1.5 s: the error shows the client gave up first.
    assert result == SourceResult.failed(f"prometheus {url}: no answer within 500ms (timeout)")
    assert elapsed >= 0.5
    assert server_timeouts == ["500ms"]  # one request, and Prometheus told to give up too


async def test_the_bearer_token_is_sent_and_never_shown(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    token = "tok-3f9a-not-for-logs"
    authorizations: list[str | None] = []

    async def query(request: web.Request) -> web.Response:
        authorizations.append(request.headers.get("Authorization"))
        if request.query["query"] != "up":  # a proxy that echoes what it refused
            return web.Response(status=502, text=f"refused {request.headers['Authorization']}")
        vector = [
            {"metric": {"instance": "a"}, "value": [1700000000.5, "0.5"]},
            {"metric": {"instance": "b"}, "value": [1700000000.5, "NaN"]},
        ]
        return web.json_response({"status": "success", "data": {"result": vector}})

    url = await fake_prometheus(aiohttp_server, query)
    source = PrometheusSource(url, timeout=2.0, bearer_token=token)
    answered = await source.query_expr("up")
    refused = await source.query_expr("down")
    await source.close()

    assert authorizations == [f"Bearer {token}", f"Bearer {token}"]
    assert answered == SourceResult.of([({"instance": "a"}, 0.5)])  # NaN is no data
    assert refused == SourceResult.failed(f"prometheus {url}: HTTP 502: refused Bearer <redacted>")
    assert token not in repr(source)
    assert "bearer_token='set'" in repr(source)


async def test_credentials_in_the_url_are_used_and_never_shown(
    aiohttp_server: AiohttpServer, unused_tcp_port: int
) -> None:
    async def query(request: web.Request) -> web.Response:  # a proxy that echoes who asked
        assert request.headers["Authorization"].startswith("Basic ")  # requests sent them
        return web.Response(status=502, text="refused ops:pw-77aa")

    plain = await fake_prometheus(aiohttp_server, query)
    with_credentials = plain.replace("http://", "http://ops:pw-77aa@")
    source = PrometheusSource(with_credentials, timeout=2.0)
    refused = await source.query_expr("up")
    await source.close()
    down = f"http://ops:pw-77aa@127.0.0.1:{unused_tcp_port}"
    source = PrometheusSource(down, timeout=2.0)
    unreachable = await source.query_expr("up")
    await source.close()

    assert refused == SourceResult.failed(f"prometheus {plain}: HTTP 502: refused <redacted>:<redacted>")
    assert unreachable == SourceResult.failed(
        f"prometheus http://127.0.0.1:{unused_tcp_port}: connection refused"
    )
