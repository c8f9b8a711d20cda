"""The scrape source: reads vLLM ``/metrics`` directly and computes the catalog's signals itself.

Each target keeps a ring of (timestamp, snapshot) pairs covering ``retention`` seconds. A query
takes the samples inside ``[now - window, now]`` and evaluates what ``Signal.promql`` says over
them, with Prometheus's semantics (``sources.windows``), ``instance`` = host:port of the target
(or the name the config gives it: two targets on one host:port need names to stay apart).

A target is *warming up* until it can answer: before its first scrape, and while it has answered
but holds fewer than two samples (no rate yet). A target whose last scrape failed is not warming
up: it is down, and its series have no data.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import aiohttp

from specguard.common.redact import scrub, shown
from specguard.rules.matchers import Matcher
from specguard.rules.signals import Kind, Signal
from specguard.sources.base import SourceResult, chain_result
from specguard.sources.targets import TargetHealth, duplicate_instances, instance_label
from specguard.sources.windows import chain_counts, evaluate, in_window
from specguard.store.exposition import Snapshot, parse_exposition

log = logging.getLogger(__name__)

# Ask for the classic text format: prometheus_client's text parser does not read OpenMetrics.
_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
_RAW_PROMQL = "raw PromQL (expr) needs the prometheus source; the scrape source computes catalog signals only"


class _HTTPStatusError(Exception):
    pass


class _PageTooLarge(Exception):
    pass


DEFAULT_MAX_PAGE_BYTES = 16 * 1024 * 1024  # a real vLLM page is about 60 KB per model


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
            self.instances[target]: in_window(ring, now - window, now, edge)
            for target, ring in self._rings.items()
        }
        groups = signal.groups(group_by, keep_intrinsic)
        if edge:
            counts = chain_counts(signal, windows, groups, tuple(match))
            result = chain_result(signal, counts, 1.0, self.warming_up())
        else:
            result = SourceResult.checked(
                signal, evaluate(signal, windows, groups, tuple(match)), self.warming_up()
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
