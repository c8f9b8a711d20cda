"""The evidence the cases read: one window of the host's numbers, in history's shape.

Three ways to the same spans (``store/history.py``'s per-minute components):

- **history** (the default): the store's history over the window, as the daemon recorded it (by
  the minute in a window up to six hours, so that case 1 sees its quarters);
- **prometheus**: instant queries of the raw vLLM series at the window's start, at each whole hour
  inside it (at each quarter of a window under two hours) and at its end, turned into exposition
  snapshots per instance and compared with ``store.history.increases`` (reset-aware, as history
  counts); the KV-cache usage from ``max_over_time`` / ``avg_over_time`` over each stretch;
- **scrape**: the config's targets scraped now, every few seconds for a short window (``--scrape
  60s``), each scrape compared with the one before it.

A server's spans and a router's are told apart by their components (the router's are ``route:``
and ``malformed:``). What could not be read goes to ``Evidence.notes``, which the cases show.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from specguard.common.redact import shown
from specguard.playbook.diagnose.evidence import Evidence
from specguard.store.exposition import Labels, Snapshot, catalog_sample_names
from specguard.store.history import HOUR, MALFORMED, MINUTE, ROUTE, Components, Span, gauges, increases, merge

Keyed = dict[tuple[str, str], list[Span]]
# Prometheus's own labels, which a vLLM page does not carry.
_TARGET_LABELS = ("instance", "job")
KV = "vllm:kv_cache_usage_perc"
MINUTE_ROWS_UP_TO = 6 * HOUR  # a window up to this long is read by the minute from history
SCRAPE_STEP = 5.0  # seconds between two scrapes of a live window (at most; six scrapes at least)


class GatherError(Exception):
    """Input the command line must refuse (exit 2): a file that cannot be read, a source not set."""


def split(read: Mapping[tuple[str, str], Sequence[Span]]) -> tuple[Keyed, dict[str, list[Span]]]:
    """History's series as vLLM servers and routers (an instance whose components are the router's)."""
    servers: Keyed = {}
    routes: dict[str, list[Span]] = {}
    for (instance, model), spans in read.items():
        if any(key.startswith((ROUTE, MALFORMED)) for span in spans for key in span.parts):
            routes.setdefault(instance, []).extend(spans)
        else:
            servers[(instance, model)] = list(spans)
    return servers, routes


# --- history ---------------------------------------------------------------------------------------


async def from_history(
    path: Path, start: float, end: float
) -> tuple[Keyed, dict[str, list[Span]], list[str]]:
    """The store's history over ``[start, end)``."""
    from specguard.store import history
    from specguard.store.database import StoreError, opened

    if not path.is_file():
        return (
            {},
            {},
            [f"no state database at {path}: the daemon has not recorded history with this state_dir"],
        )
    hours = end - start > MINUTE_ROWS_UP_TO  # a short window by the minute: its quarters are told apart
    try:
        async with opened(path) as store:
            read = await store.call(lambda db: history.read(db, start, end, hours=hours))
    except StoreError as exc:
        return {}, {}, [f"the state database {path}: {exc}"]
    servers, routes = split(read)
    notes = [] if read else [f"no history between {_when(start)} and {_when(end)} in {path}"]
    return servers, routes, notes


# --- snapshots to spans ----------------------------------------------------------------------------


def spans_from(points: Sequence[tuple[float, Snapshot]], every_gauge: bool = True) -> dict[str, list[Span]]:
    """Each model's spans from one instance's snapshots, oldest first: one span per stretch between
    two of them, with the counters' increases (reset-aware) and, with ``every_gauge``, the gauges of
    the later snapshot (the first's go into the first span)."""
    out: dict[str, list[Span]] = {}
    for i in range(1, len(points)):
        (t0, before), (t1, after) = points[i - 1], points[i]
        per_model: dict[str, Components] = {}
        for model, parts in increases(before, after).items():
            merge(per_model.setdefault(model, {}), parts)
        if every_gauge:
            for snapshot in (before, after) if i == 1 else (after,):
                for model, parts in gauges(snapshot).items():
                    merge(per_model.setdefault(model, {}), parts)
        minutes = max(1, round((t1 - t0) / MINUTE))
        for model, parts in per_model.items():
            out.setdefault(model, []).append(Span(int(t0), minutes, parts))
    return out


# --- Prometheus ------------------------------------------------------------------------------------


class Querier(Protocol):
    async def __call__(self, expr: str, at: float) -> list[tuple[Mapping[str, str], float]] | str: ...


@asynccontextmanager
async def prometheus_querier(
    url: str, timeout: float, token: str | None, verify_tls: bool
) -> AsyncIterator[Querier]:
    """Instant queries at a given time through the Prometheus source (its errors as text); the
    source is closed on the way out."""
    from specguard.sources.prometheus import PrometheusSource

    source = PrometheusSource(url, timeout, bearer_token=token, verify_tls=verify_tls)

    async def query(expr: str, at: float) -> list[tuple[Mapping[str, str], float]] | str:
        result = await source.query_expr(expr, at)
        if result.error is not None:
            return result.error
        return [(series.labels, series.value) for series in result.series]

    try:
        yield query
    finally:
        await source.close()


def points_in(start: float, end: float) -> list[float]:
    """The window's start, each whole hour inside it and its end; a window under two hours in
    quarters (case 1 looks for preemptions rising from one stretch to the next)."""
    if end - start < 2 * HOUR:
        return [start + (end - start) * i / 4 for i in range(4)] + [end]
    first = math.floor(start / HOUR) * HOUR + HOUR
    return [start, *(float(t) for t in range(int(first), math.ceil(end), HOUR) if start < t < end), end]


def _names_regex() -> str:
    return "|".join(sorted(n for n in catalog_sample_names() if n != KV))


async def from_prometheus(
    query: Querier, start: float, end: float
) -> tuple[Keyed, dict[str, list[Span]], list[str]]:
    """The raw series at the window's points, as history would have counted them."""
    selector = f'{{__name__=~"{_names_regex()}"}}'
    by_instance: dict[str, list[tuple[float, dict[str, dict[Labels, float]]]]] = {}
    notes: list[str] = []
    moments = points_in(start, end)
    for at in moments:
        answer = await query(selector, at)
        if isinstance(answer, str):
            return {}, {}, [f"Prometheus at {_when(at)}: {answer}"]
        snapshots: dict[str, dict[str, dict[Labels, float]]] = {}
        for labels, value in answer:
            name = labels.get("__name__", "")
            instance = labels.get("instance", "")
            kept = tuple(sorted((k, v) for k, v in labels.items() if k not in (*_TARGET_LABELS, "__name__")))
            snapshots.setdefault(instance, {}).setdefault(name, {})[kept] = value
        for instance, snapshot in snapshots.items():
            by_instance.setdefault(instance, []).append((at, snapshot))
    read: Keyed = {}
    for instance, points in by_instance.items():
        for model, spans in spans_from(points, every_gauge=False).items():
            read[(instance, model)] = spans
    kv = await _kv_usage(query, moments)
    if isinstance(kv, str):
        notes.append(f"KV-cache usage from Prometheus: {kv}")
    else:
        for key, spans in read.items():
            for i, span in enumerate(spans):
                merge(span.parts, kv.get((key, i), {}))
    servers, routes = split(read)
    if not servers and not routes:
        notes.append(f"Prometheus has no vLLM series between {_when(start)} and {_when(end)}")
    return servers, routes, notes


async def _kv_usage(
    query: Querier, moments: Sequence[float]
) -> dict[tuple[tuple[str, str], int], Components] | str:
    """Per (instance, model) and stretch: the KV-cache usage's sum, count and peak, the fullest
    engine's (history keeps the fullest engine at each scrape)."""
    out: dict[tuple[tuple[str, str], int], Components] = {}
    for i in range(1, len(moments)):
        seconds = max(1, round(moments[i] - moments[i - 1]))
        found: dict[str, dict[tuple[str, str], float]] = {}
        for what in ("max", "avg", "count"):
            expr = f"max by (instance, model_name) ({what}_over_time({KV}[{seconds}s]))"
            answer = await query(expr, moments[i])
            if isinstance(answer, str):
                return answer
            found[what] = {(s.get("instance", ""), s.get("model_name", "")): v for s, v in answer}
        for key, peak in found["max"].items():
            n = found["count"].get(key, 0.0)
            if n > 0:
                out[(key, i - 1)] = {"kv:sum": found["avg"].get(key, peak) * n, "kv:n": n, "max:kv": peak}
    return out


# --- a live scrape ---------------------------------------------------------------------------------


async def from_scrape(
    targets: Sequence[str],
    names: Mapping[str, str],
    seconds: float,
    timeout: float,
    max_page_bytes: int,
    clock: Callable[[], float] = time.time,
    step: float | None = None,
) -> tuple[float, float, Keyed, dict[str, list[Span]], list[str]]:
    """Scrape ``targets`` for ``seconds`` (every ``step``, by default 5 s or a sixth of the
    window) and return the window with its spans: one span per target and model for the whole
    window, its increases summed scrape by scrape, every scrape's gauges in it."""
    from specguard.sources.scrape import ScrapeSource

    every = step if step is not None else min(SCRAPE_STEP, seconds / 6)
    source = ScrapeSource(targets, timeout=timeout, retention=seconds + 4 * timeout + 60, names=names,
                          max_page_bytes=max_page_bytes, clock=clock)  # fmt: skip
    points: dict[str, list[tuple[float, Snapshot]]] = {}
    start = clock()
    try:
        while True:
            await source.refresh()
            for instance, at, snapshot in source.latest():
                taken = points.setdefault(instance, [])
                if not taken or taken[-1][0] < at:
                    taken.append((at, snapshot))
            if clock() - start >= seconds:
                break
            await asyncio.sleep(min(every, max(0.0, seconds - (clock() - start))))
    finally:
        await source.close()
    end = clock()
    notes = [f"scraping {shown(url)}: {error}" for url, error in sorted(source.last_errors.items())]
    read: Keyed = {}
    for instance, taken in points.items():
        if len(taken) < 2:
            notes.append(f"{instance}: fewer than two scrapes in {seconds:g} s: no increase to read")
            continue
        for model, spans in spans_from(taken).items():
            parts: Components = {}
            for span in spans:
                merge(parts, span.parts)
            read[(instance, model)] = [Span(int(start), max(1, round((end - start) / MINUTE)), parts)]
    servers, routes = split(read)
    return start, end, servers, routes, notes


# --- files -----------------------------------------------------------------------------------------


def load_bench(path: Path) -> dict[str, Any]:
    """A ``specguard bench --json`` result. Raises GatherError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GatherError(f"--bench {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"line {exc.lineno}: " if isinstance(exc, json.JSONDecodeError) else ""
        raise GatherError(
            f"--bench {path}: {where}not a `specguard bench --json` result (not JSON)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("phases"), dict):
        raise GatherError(
            f"--bench {path}: phases: not a `specguard bench --json` result (no `phases` mapping)"
        )
    return data


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


# --- the evidence ----------------------------------------------------------------------------------


async def gather(
    loaded: Any,
    start: float,
    end: float,
    source: str = "history",
    scrape_seconds: float | None = None,
    bench: Path | None = None,
    unit: str | None = None,
    log_file: Path | None = None,
    prometheus_url: str | None = None,
) -> Evidence:
    """The evidence for the cases from a loaded config (``config.loading.Loaded``): the window from
    ``source`` (history, prometheus or scrape), the baseline, the routing section, the serving file,
    and the files given. Raises GatherError for input the command must refuse."""
    config = loaded.config
    bench_data = load_bench(bench) if bench is not None else None
    if log_file is not None and not log_file.is_file():
        raise GatherError(f"--log {log_file}: no such file")
    if source == "scrape":
        scrape = config.history.scrape if config.sources.prometheus is not None else config.scrape
        if scrape is None:
            raise GatherError(
                "--scrape: the config reads Prometheus and has no history.scrape targets to scrape"
            )
        start, end, servers, routes, notes = await from_scrape(
            scrape.urls, scrape.names, scrape_seconds or 60.0, scrape.timeout, scrape.max_page_size
        )
    elif source == "prometheus":
        p = config.sources.prometheus
        url = prometheus_url or (p.url if p is not None else None)
        if url is None:
            raise GatherError("--prometheus: the config has no sources.prometheus: give its URL")
        async with prometheus_querier(
            url,
            p.timeout if p is not None else 10.0,
            loaded.prometheus_token if p is not None and prometheus_url is None else None,
            p.verify_tls if p is not None else True,
        ) as query:
            servers, routes, notes = await from_prometheus(query, start, end)
    else:
        servers, routes, notes = await from_history(config.store_file(), start, end)
    return Evidence(
        source=source, start=start, end=end, servers=servers, routes=routes, baseline=loaded.baseline,
        routing=config.routing, serving_file=config.serving, bench=bench_data, unit=unit,
        log_file=log_file, notes=tuple(notes),
    )  # fmt: skip
