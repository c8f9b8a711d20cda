"""The scrape source: reads vLLM ``/metrics`` directly and computes the catalog's signals itself.

Each target keeps a ring of (timestamp, snapshot) pairs covering ``retention`` seconds. A query
takes the samples inside ``[now - window, now]`` and evaluates what ``Signal.promql`` says, with
Prometheus's semantics: label matchers, ``sum by`` aggregation, the ``> 0`` filter on denominators,
counter resets, ``histogram_quantile``'s bucket algorithm and ``instance`` = host:port of the target
(or the name the config gives it: two targets on one host:port need names to stay apart).

A target is *warming up* until it can answer: before its first scrape, and while it has answered
but holds fewer than two samples (no rate yet). A target whose last scrape failed is not warming
up: it is down, and its series have no data.

One deliberate difference: ``rate`` is the increase between the first and the last sample in the
window divided by the time between them, with no extrapolation. Prometheus extrapolates the
increase towards the window edges and divides by the whole window, which gives about the same
per-second value; and as series of one target share their scrape times, the factor is the same
for numerator and denominator, so ratios, per-position shares and quantiles do not change.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import pairwise
from urllib.parse import urlsplit

import aiohttp

from specguard.common.redact import scrub, shown
from specguard.rules.matchers import Matcher, all_match
from specguard.rules.signals import Kind, Metric, Signal
from specguard.sources.base import ChainCounts, SourceResult, chain_result
from specguard.store.exposition import Labels, Snapshot, parse_exposition

log = logging.getLogger(__name__)

_Point = tuple[float, float]  # (timestamp, value)
_Window = list[tuple[float, Snapshot]]
_Key = tuple[str, ...]  # values of the group-by labels, "" where a label is absent
_Item = tuple[dict[str, str], float]
_Match = tuple[Matcher, ...]

# Ask for the classic text format: prometheus_client's text parser does not read OpenMetrics.
_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
_RAW_PROMQL = "raw PromQL (expr) needs the prometheus source; the scrape source computes catalog signals only"


class _HTTPStatusError(Exception):
    pass


class _PageTooLarge(Exception):
    pass


DEFAULT_MAX_PAGE_BYTES = 16 * 1024 * 1024  # a real vLLM page is about 60 KB per model


@dataclass
class TargetHealth:
    """What the last scrapes of one target came to, as /api/status shows it."""

    target: str  # the URL as shown: credentials and secret query values removed
    instance: str
    last_success: float | None = None
    last_error: str | None = None
    error_since: float | None = None  # when the current run of failures began
    failures: int = 0  # failed scrapes since the source started

    def to_json(self, warming: bool) -> dict[str, object]:
        state = "warming_up" if warming else "down" if self.last_error is not None else "up"
        return {**asdict(self), "state": state}


class ScrapeSource:
    """Scrapes vLLM ``/metrics`` endpoints and answers signal queries from its own sample rings."""

    kind = "scrape"

    def __init__(
        self,
        targets: Sequence[str],
        timeout: float,
        retention: float,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] | None = None,
        names: Mapping[str, str] | None = None,
        max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
    ) -> None:
        """``targets`` are URLs; ``names`` gives some of them the ``instance`` label they report
        under (default: host:port). ``timeout`` bounds a whole scrape, reading and parsing;
        ``max_page_bytes`` bounds the page. Raises ValueError when two targets would report as one."""
        if timeout <= 0 or retention <= 0 or max_page_bytes <= 0:
            raise ValueError("scrape timeout, retention and page size limit must be positive")
        self.targets: tuple[str, ...] = tuple(dict.fromkeys(targets))
        self.instances: dict[str, str] = {t: (names or {}).get(t) or instance_label(t) for t in self.targets}
        clash = duplicate_instances(self.instances)
        if clash:
            raise ValueError(clash)
        self.last_errors: dict[str, str] = {}  # by target URL; messages never carry its secrets
        self.health: dict[str, TargetHealth] = {
            t: TargetHealth(shown(t), self.instances[t]) for t in self.targets
        }
        self._attempted: set[str] = set()
        self._timeout = timeout
        self._max_page = max_page_bytes
        self._retention = retention
        # time.time looked up at each call, not bound here: a simulated clock patched in applies
        self._clock = clock or (lambda: time.time())
        self._session = session
        self._owns_session = session is None
        self._rings: dict[str, deque[tuple[float, Snapshot]]] = {t: deque() for t in self.targets}
        # Overlapping refreshes could store samples out of order; one at a time keeps rings sorted.
        self._refresh_lock = asyncio.Lock()

    # --- taking samples ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Scrape every target once, concurrently. Never raises: failures go to ``last_errors``."""
        if not self.targets:
            return
        async with self._refresh_lock:
            if self._session is None:
                # Created here, not in __init__, because aiohttp wants a running event loop.
                self._session = aiohttp.ClientSession()
            session = self._session
            await asyncio.gather(*(self._scrape(session, target) for target in self.targets))

    def ingest(self, target: str, text: str, ts: float) -> None:
        """Store ``text`` as ``target``'s sample taken at ``ts``: a scrape without HTTP."""
        self._attempted.add(target)
        self.instances.setdefault(target, instance_label(target))
        self.health.setdefault(target, TargetHealth(shown(target), self.instances[target]))
        try:
            snapshot = parse_exposition(text)
        except ValueError as exc:
            self._fail(target, str(exc), ts)
            return
        self._store(target, snapshot, ts)

    async def _scrape(self, session: aiohttp.ClientSession, target: str) -> None:
        ts = self._clock()  # like Prometheus, a sample is stamped with its scrape's start
        try:
            # One deadline for reading and parsing: a trickling or enormous page cannot hold a round.
            async with asyncio.timeout(self._timeout):
                text = await self._fetch(session, target)
                # Parsing runs off the event loop (a page the size limit allows still takes time).
                snapshot = await asyncio.to_thread(parse_exposition, text)
        except Exception as exc:  # one bad target must not spoil the round for the others
            self._attempted.add(target)
            self._fail(target, self._describe(exc), ts)
            return
        self._attempted.add(target)
        self._store(target, snapshot, ts)

    def latest(self) -> list[tuple[str, float, Snapshot]]:
        """Each target's newest sample as (instance, time, snapshot): what history records."""
        return [(self.instances[t], ring[-1][0], ring[-1][1]) for t, ring in self._rings.items() if ring]

    def warming_up(self) -> frozenset[str]:
        """The ``instance`` of every target that cannot answer yet (see the module's docstring)."""
        return frozenset(self.instances[target] for target in self.targets if self._warming(target))

    def _warming(self, target: str) -> bool:
        return target not in self._attempted or (
            target not in self.last_errors and len(self._rings.get(target, ())) < 2
        )

    def target_health(self) -> list[dict[str, object]]:
        """Each target's state (up, down, warming_up), last success and last error."""
        return [self.health[target].to_json(self._warming(target)) for target in self.targets]

    def adopt(self, other: ScrapeSource) -> None:
        """Take over ``other``'s samples of the targets both scrape under the same name (a reload
        that changed something else need not warm them up again)."""
        for target in self.targets:
            if target in other._rings and other.instances.get(target) == self.instances[target]:
                self._rings[target] = deque(other._rings[target])
                self.health[target] = other.health[target]
                if target in other._attempted:
                    self._attempted.add(target)
                if target in other.last_errors:
                    self.last_errors[target] = other.last_errors[target]

    async def _fetch(self, session: aiohttp.ClientSession, target: str) -> str:
        async with session.get(target, headers={"Accept": _ACCEPT}) as response:
            if response.status != 200:
                raise _HTTPStatusError(f"HTTP {response.status} {response.reason or ''}".strip())
            if response.content_length is not None and response.content_length > self._max_page:
                raise _PageTooLarge(
                    f"the page is {response.content_length} bytes, over the {self._max_page}-byte limit"
                )
            body = bytearray()
            async for chunk in response.content.iter_chunked(65536):
                body += chunk
                if len(body) > self._max_page:
                    raise _PageTooLarge(f"the page is over the {self._max_page}-byte limit (stopped reading)")
        return body.decode("utf-8", errors="replace")

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, TimeoutError):
            return f"no page within {self._timeout:g}s (reading and parsing)"
        if isinstance(exc, _HTTPStatusError | _PageTooLarge | ValueError):
            return str(exc)
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    def _store(self, target: str, snapshot: Snapshot, ts: float) -> None:
        ring = self._rings.setdefault(target, deque())
        # A wall clock stepped back leaves samples stamped in the future: drop them so the ring
        # stays sorted and rates never see time running backwards.
        while ring and ring[-1][0] >= ts:
            ring.pop()
        ring.append((ts, snapshot))
        self._prune(ring, ts)
        health = self.health[target]
        health.last_success, health.last_error, health.error_since = ts, None, None
        if self.last_errors.pop(target, None) is not None:
            log.info("scrape of %s recovered", shown(target))

    def _fail(self, target: str, message: str, ts: float) -> None:
        message = scrub(message, target)
        if self.last_errors.get(target) != message:  # log changes, not every failed round
            log.warning("scrape of %s failed: %s", shown(target), message)
        self.last_errors[target] = message
        health = self.health[target]
        health.failures += 1
        health.last_error = message
        if health.error_since is None:
            health.error_since = ts
        self._prune(self._rings.setdefault(target, deque()), ts)

    def _prune(self, ring: deque[tuple[float, Snapshot]], newest: float) -> None:
        while ring and ring[0][0] < newest - self._retention:
            ring.popleft()

    # --- answering queries ------------------------------------------------------------------------

    async def query_signal(
        self,
        signal: Signal,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> SourceResult:
        now = self._clock()
        # The chain model's counts also take the last sample before the window: consecutive
        # windows then share their edge sample and tile the counters, so a sequential test fed
        # one window per evaluation sees every draft exactly once.
        edge = signal.kind is Kind.CHAIN
        windows = {
            self.instances[target]: _window(ring, now - window, now, edge)
            for target, ring in self._rings.items()
        }
        groups = signal.groups(group_by, keep_intrinsic)
        if edge:
            counts = _chain_counts(signal, windows, groups, tuple(match))
            result = chain_result(signal, counts, 1.0, self.warming_up())
        else:
            result = SourceResult.checked(
                signal, _evaluate(signal, windows, groups, tuple(match)), self.warming_up()
            )
        if not self.last_errors:
            return result
        errors = "; ".join(f"{shown(target)}: {error}" for target, error in self.last_errors.items())
        return replace(result, detail={"scrape_errors": errors})

    async def query_expr(self, expr: str) -> SourceResult:
        return SourceResult.failed(_RAW_PROMQL)

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None  # a later refresh opens a new one


# --- PromQL semantics over the rings --------------------------------------------------------------


def signal_over(
    signal: Signal,
    samples: Mapping[str, Sequence[tuple[float, Snapshot]]],
    group_by: Sequence[str],
) -> SourceResult:
    """``signal`` over samples taken elsewhere, per ``group_by``: what a rule's query computes over
    a window that holds exactly these samples of each target (``samples`` by ``instance``), with the
    same code (``histogram_quantile`` over the buckets' increases for a quantile, counter resets,
    the sum over engines). For a tool that reads ``/metrics`` itself, as ``specguard bench`` does
    before and after each phase, so that its figures are the ones the rules compare with."""
    if signal.kind is Kind.CHAIN:
        raise ValueError(f"{signal.name} needs the scrape source's edge samples: query the source")
    windows = {instance: sorted(points, key=lambda point: point[0]) for instance, points in samples.items()}
    return SourceResult.checked(signal, _evaluate(signal, windows, signal.groups(group_by), ()))


def _evaluate(
    signal: Signal, windows: Mapping[str, _Window], groups: list[str], match: _Match
) -> list[_Item]:
    if signal.kind is Kind.RATIO or (signal.kind is Kind.PER_POSITION and "position" not in groups):
        assert signal.denominator is not None
        num = _sum_by(_rates(windows, signal.metric, match), groups)
        den = _sum_by(_rates(windows, signal.denominator, _without(match, "position")), groups)
        # `num / (den > 0)`: a group without drafts in the window has no value, not NaN or 0.
        return [
            (_labels(groups, key), signal.offset + value / den[key])
            for key, value in num.items()
            if den.get(key, 0.0) > 0
        ]
    if signal.kind is Kind.PER_POSITION:
        assert signal.denominator is not None
        outer = [g for g in groups if g not in signal.intrinsic_labels]
        num = _sum_by(_rates(windows, signal.metric, match), groups)
        den = _sum_by(_rates(windows, signal.denominator, _without(match, "position")), outer)
        items = []
        for key, value in num.items():  # `on (outer) group_left ()`: one denominator per group
            labels = _labels(groups, key)
            drafts = den.get(tuple(labels.get(g, "") for g in outer), 0.0)
            if drafts > 0:
                items.append((labels, value / drafts))
        return items
    if signal.kind is Kind.QUANTILE:
        assert signal.quantile is not None
        return _quantiles(signal.quantile, _rates(windows, signal.metric, match, "_bucket"), groups)
    if signal.kind is Kind.GAUGE:
        return _combine_by(_averages(windows, signal.metric, match), groups, signal.combine)
    if signal.kind is Kind.RATE:
        totals = _sum_by(_rates(windows, signal.metric, match), groups)
        return [(_labels(groups, key), value) for key, value in totals.items()]
    if signal.kind is Kind.POSITIONS:
        return _positions(windows, signal.metric, match, groups)
    raise ValueError(f"{signal.name} is derived from {', '.join(signal.inputs)}: not a source query")


def _window(ring: Iterable[tuple[float, Snapshot]], start: float, end: float, edge: bool) -> _Window:
    """The ring's samples in [start, end]. With ``edge``: those in (start, end] after the last one
    at or before ``start``, so that windows (a, b] and (b, c] share exactly one sample."""
    if not edge:
        return [(ts, snap) for ts, snap in ring if start <= ts <= end]
    inside: _Window = []
    before: tuple[float, Snapshot] | None = None
    for ts, snap in ring:
        if ts <= start:
            before = (ts, snap)
        elif ts <= end:
            inside.append((ts, snap))
    return [before, *inside] if before is not None and inside else inside


def _chain_counts(
    signal: Signal, windows: Mapping[str, _Window], groups: list[str], match: _Match
) -> list[ChainCounts]:
    """Per group: accepted tokens, trials (accepted + drafts - drafts accepted whole), draft tokens
    and drafts x k, engine by engine, as counter increases over each target's window."""
    assert signal.denominator is not None and signal.per_position is not None
    assert signal.draft_tokens is not None
    match = _without(match, "position")
    accepted = _sum_by(_increases(windows, signal.metric, match), groups)
    drafts_by_engine = _increases(windows, signal.denominator, match)
    drafts = _sum_by(drafts_by_engine, groups)
    tokens = _sum_by(_increases(windows, signal.draft_tokens, match), groups)
    # Per engine (every label but the position): the last position's count is the smallest, and
    # the number of positions is k.
    full: dict[tuple[tuple[str, str], ...], float] = {}
    positions: dict[tuple[tuple[str, str], ...], int] = {}
    labels_of: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for labels, value in _increases(windows, signal.per_position, match):
        engine = {k: v for k, v in labels.items() if k != "position"}
        key = tuple(sorted(engine.items()))
        full[key] = min(full.get(key, math.inf), value)
        positions[key] = positions.get(key, 0) + 1
        labels_of[key] = engine
    whole = _sum_by(((labels_of[key], value) for key, value in full.items()), groups)
    expected: dict[_Key, float] = {}
    for labels, value in drafts_by_engine:
        k = positions.get(tuple(sorted(labels.items())), 0)
        group = _key(labels, groups)
        expected[group] = expected.get(group, 0.0) + value * k
    return [
        ChainCounts(
            _labels(groups, key),
            successes=value,
            trials=value + drafts.get(key, 0.0) - whole.get(key, 0.0),
            draft_tokens=tokens.get(key, 0.0),
            expected_tokens=expected.get(key, 0.0),
        )
        for key, value in accepted.items()
        if drafts.get(key, 0.0) > 0
    ]


def instance_label(target: str) -> str:
    """``host:port`` of a target URL, as Prometheus's default ``instance`` label."""
    netloc = urlsplit(target).netloc
    return netloc.rpartition("@")[2] if netloc else target


def duplicate_instances(instances: Mapping[str, str]) -> str | None:
    """A message when two targets would report under one ``instance`` label, else None."""
    seen: dict[str, str] = {}
    for target, instance in instances.items():
        if instance in seen:
            return (
                f"scrape targets {seen[instance]} and {target} would both report as instance "
                f"{instance!r}: give them distinct names"
            )
        seen[instance] = target
    return None


def _series(window: _Window, metric: Metric, suffix: str) -> dict[Labels, list[_Point]]:
    """Every series of ``metric`` in one target's window, under the name the target exposes now."""
    if not window:
        return {}
    newest = window[-1][1]
    name = next((n + suffix for n in metric.names if n + suffix in newest), None)
    if name is None:
        return {}
    series: dict[Labels, list[_Point]] = {}
    for ts, snapshot in window:
        for labels, value in snapshot.get(name, {}).items():
            series.setdefault(labels, []).append((ts, value))
    return series


def _with_instance(labels: Labels, instance: str) -> dict[str, str]:
    out = dict(labels)
    if "instance" in out:  # Prometheus (honor_labels: false) keeps a target's own as exported_
        out["exported_instance"] = out.pop("instance")
    out["instance"] = instance
    return out


def _rates(windows: Mapping[str, _Window], metric: Metric, match: _Match, suffix: str = "") -> list[_Item]:
    return _counted(windows, metric, match, suffix, counter_rate)


def _increases(windows: Mapping[str, _Window], metric: Metric, match: _Match) -> list[_Item]:
    return _counted(windows, metric, match, "", counter_increase)


def _counted(
    windows: Mapping[str, _Window],
    metric: Metric,
    match: _Match,
    suffix: str,
    measure: Callable[[Sequence[_Point]], float],
) -> list[_Item]:
    items = []
    for instance, window in windows.items():
        for labels, points in _series(window, metric, suffix).items():
            full = _with_instance(labels, instance)
            if len(points) >= 2 and all_match(match, full):  # a rate needs two samples
                items.append((full, measure(points)))
    return items


def _averages(windows: Mapping[str, _Window], metric: Metric, match: _Match) -> list[_Item]:
    items = []
    for instance, window in windows.items():
        for labels, points in _series(window, metric, "").items():
            full = _with_instance(labels, instance)
            if all_match(match, full):
                values = [value for _, value in points]
                items.append((full, sum(values) / len(values)))
    return items


def _positions(
    windows: Mapping[str, _Window], metric: Metric, match: _Match, groups: Sequence[str]
) -> list[_Item]:
    """``max by (groups) (count by (instance, engine, groups) (metric))`` on the newest sample."""
    per_engine: dict[_Key, int] = {}
    inner = list(dict.fromkeys(["instance", "engine", *groups]))
    for instance, window in windows.items():
        if not window:
            continue
        newest = window[-1][1]
        name = next((n for n in metric.names if n in newest), None)
        for labels in newest.get(name, {}) if name else {}:
            full = _with_instance(labels, instance)
            if all_match(match, full):
                key = _key(full, inner)
                per_engine[key] = per_engine.get(key, 0) + 1
    most: dict[_Key, float] = {}
    for key, count in per_engine.items():
        group = _key(_labels(inner, key), groups)
        most[group] = max(most.get(group, 0.0), float(count))
    return [(_labels(groups, key), value) for key, value in most.items()]


def _without(match: _Match, label: str) -> _Match:
    return tuple(m for m in match if m.label != label)


def counter_increase(points: Sequence[_Point]) -> float:
    """Increase of a counter over ``points`` (sorted, >= 2), resets included: as Prometheus counts
    it (last - first, plus the value before every decrease, a decrease being a restart from 0),
    without Prometheus's extrapolation to the window edges."""
    increase = points[-1][1] - points[0][1]
    for (_, previous), (_, current) in pairwise(points):
        if current < previous:
            increase += previous
    return increase


def counter_rate(points: Sequence[_Point]) -> float:
    """Per-second increase of a counter over ``points`` (sorted, >= 2), resets included."""
    return counter_increase(points) / (points[-1][0] - points[0][0])


def _key(labels: Mapping[str, str], groups: Sequence[str]) -> _Key:
    return tuple(labels.get(g, "") for g in groups)


def _labels(groups: Sequence[str], key: _Key) -> dict[str, str]:
    # An empty value is an absent label in Prometheus: leave it out.
    return {g: v for g, v in zip(groups, key, strict=True) if v}


def _sum_by(items: Iterable[_Item], groups: Sequence[str]) -> dict[_Key, float]:
    totals: dict[_Key, float] = {}
    for labels, value in items:
        key = _key(labels, groups)
        totals[key] = totals.get(key, 0.0) + value
    return totals


def _combine_by(items: Iterable[_Item], groups: Sequence[str], combine: str) -> list[_Item]:
    """``max by`` or ``sum by`` (groups) of per-series values."""
    totals: dict[_Key, list[float]] = {}
    for labels, value in items:
        totals.setdefault(_key(labels, groups), []).append(value)
    pick = max if combine == "max" else sum
    return [(_labels(groups, key), float(pick(vals))) for key, vals in totals.items()]


def _quantiles(q: float, bucket_rates: Iterable[_Item], groups: Sequence[str]) -> list[_Item]:
    """``histogram_quantile(q, sum by (groups, le) (rate(x_bucket[w])))``."""
    groups = [g for g in groups if g != "le"]
    histograms: dict[_Key, list[tuple[float, float]]] = {}
    for key, value in _sum_by(bucket_rates, [*groups, "le"]).items():
        try:
            upper = float(key[-1])
        except ValueError:  # Prometheus skips buckets without a parsable `le`
            continue
        if not math.isnan(upper):
            histograms.setdefault(key[:-1], []).append((upper, value))
    return [(_labels(groups, key), bucket_quantile(q, b)) for key, b in histograms.items()]


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The q-quantile of classic histogram ``buckets`` (upper bound, cumulative count).

    Prometheus's ``BucketQuantile`` (promql/quantile.go), step for step: sort by upper bound,
    require a +Inf bucket, merge equal bounds, absorb float noise and force monotonic counts,
    interpolate linearly inside the bucket holding the rank (lower bound 0 for the first bucket
    unless its upper bound is <= 0), answer the highest finite bound if the rank falls in the +Inf
    bucket. NaN means no data: no observations, fewer than 2 buckets or no +Inf bucket.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda bucket: bucket[0])
    if not ordered or ordered[-1][0] != math.inf:
        return math.nan
    uppers: list[float] = []
    counts: list[float] = []
    for upper, count in ordered:  # coalesceBuckets
        if uppers and uppers[-1] == upper:
            counts[-1] += count
        else:
            uppers.append(upper)
            counts.append(count)
    _ensure_monotonic(counts)
    if len(counts) < 2 or counts[-1] == 0:
        return math.nan
    rank = q * counts[-1]
    b = bisect.bisect_left(counts, rank, hi=len(counts) - 1)  # sort.Search(n-1, count >= rank)
    if b == len(counts) - 1:
        return uppers[-2]
    if b == 0 and uppers[0] <= 0:
        return uppers[0]
    start, end, count = 0.0, uppers[b], counts[b]
    if b > 0:
        start = uppers[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # only when rank is 0 too: Go's 0/0 gives NaN where Python would raise
        return math.nan
    return start + (end - start) * (rank / count)


_SMALL_DELTA_TOLERANCE = 1e-12  # promql's smallDeltaTolerance


def _ensure_monotonic(counts: list[float]) -> None:
    """ensureMonotonicAndIgnoreSmallDeltas: ``prev`` stays at the last count accepted."""
    previous = counts[0]
    for i in range(1, len(counts)):
        current = counts[i]
        if current == previous:
            continue
        if _almost_equal(previous, current, _SMALL_DELTA_TOLERANCE) or current < previous:
            counts[i] = previous
            continue
        previous = current


def _almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus's util/almost.Equal (relative comparison, absolute near zero)."""
    if (math.isnan(a) and math.isnan(b)) or a == b:
        return True
    min_normal = sys.float_info.min  # Go's math.Float64frombits(0x0010000000000000)
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < min_normal:
        return diff < epsilon * min_normal
    return diff / min(abs_sum, sys.float_info.max) < epsilon
