"""A source that answers from the store's history: each signal over a window of whole minutes.

History (``store/history.py``) keeps, per vLLM server and model, each minute's counter increases,
histogram buckets and gauge samples. This source loads the components the rules need over a period
once, as running sums per server, so that any window's sum is two lookups; then it answers a signal
at the moment its clock gives as the scrape source would have: the window's increases, summed over
the servers of each ``group_by`` group, computed as the catalog's signals compute them.

What it cannot answer it says, never guesses:

- **Minutes only.** A window is the whole minutes that end at or before the moment asked (the
  minute a scrape fell in is complete only at its end); a window shorter than a minute reads the
  last whole minute, and one that is not a whole number of minutes reads the minutes that cover it.
- **Servers and models only.** History sums over every other label (engine, finish reason), so a
  rule grouped by or matching on one of them fails with the reason; ``position`` is kept for
  ``acceptance_by_position``.
- **What history keeps.** Per-request time per output token and the router's series are not kept
  per server: a rule on them fails with the reason (replay it from Prometheus).
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import zlib
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from specguard.rules.matchers import Matcher, all_match
from specguard.rules.signals import Kind, Signal
from specguard.sources.base import ChainCounts, SourceResult, chain_result
from specguard.sources.quantiles import bucket_quantile
from specguard.store.history import DRAFTS_BY_K, MINUTE, Tables

# The labels history keeps a series by, and the one it keeps inside a server's minute.
KEPT_LABELS = ("instance", "model_name")
POSITION = "position"

# Ratio signals: (numerator, denominator) components.
_RATIOS: dict[str, tuple[str, str]] = {
    "acceptance_rate": ("accepted", "draft_tokens"),
    "mean_acceptance_length": ("accepted", "drafts"),
    "e2e_latency_mean": ("e2e:sum", "e2e:count"),
}
_RATES = {
    "preemption_rate": "preemptions",
    "generation_throughput": "generation_tokens",
    "request_rate": "requests",
}
_GAUGES = {"kv_cache_usage": "kv", "running_requests": "running", "waiting_requests": "waiting"}
_HISTOGRAMS = {
    "e2e_latency_p50": "e2e",
    "e2e_latency_p95": "e2e",
    "e2e_latency_p99": "e2e",
    "ttft_p95": "ttft",
    "itl_p50": "itl",
    "itl_p95": "itl",
}
_SPECULATIVE = ("accepted", "draft_tokens", "drafts")  # and pos:i, drafts:k=N
PRESENT = "minute"  # a component of our own: 1 for each minute history holds of the server


def not_kept(signal: Signal) -> str | None:
    """Why history cannot answer ``signal``, or None when it can."""
    name = signal.name
    if name in _RATIOS or name in _RATES or name in _GAUGES or name in _HISTOGRAMS:
        return None
    if signal.kind in (Kind.CHAIN, Kind.PER_POSITION, Kind.POSITIONS, Kind.SPEEDUP):
        return None
    if name.startswith("routed_"):
        return f"{name}: history keeps the router's series by pool and class, not as a signal to replay; replay it from Prometheus"
    return f"{name}: history does not keep {signal.metric.names[0]}; replay it from Prometheus"


@dataclass(frozen=True)
class Wanted:
    """The components some signals read: by name, and by prefix (a histogram's buckets, the draft
    positions); ``everything``: all of them."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    everything: bool = False

    def __contains__(self, name: str) -> bool:
        return self.everything or name in self.names or name.startswith(self.prefixes)


_POSITIONS = ("pos:", DRAFTS_BY_K)


def components_of(signals: Iterable[Signal]) -> Wanted:
    """The components ``signals`` read."""
    names: set[str] = {PRESENT}
    prefixes: set[str] = set()
    for signal in signals:
        name = signal.name
        if name in _RATIOS:
            names.update(_RATIOS[name])
        elif name in _RATES:
            names.add(_RATES[name])
        elif name in _GAUGES:
            names.update({f"{_GAUGES[name]}:sum", f"{_GAUGES[name]}:n"})
        elif name in _HISTOGRAMS:
            prefixes.add(f"{_HISTOGRAMS[name]}:le=")
        elif signal.kind in (Kind.CHAIN, Kind.PER_POSITION, Kind.POSITIONS, Kind.SPEEDUP):
            names.update(_SPECULATIVE)
            prefixes.update(_POSITIONS)
        else:
            return Wanted(everything=True)
    return Wanted(frozenset(names), tuple(sorted(prefixes)))


@dataclass
class Recording:
    """One server's (instance, model) components over the period, as running sums by minute:
    ``sums[c][i]`` is the total of component c over the period's first i minutes."""

    labels: dict[str, str]
    sums: dict[str, array[float]] = field(default_factory=dict)
    _by_prefix: dict[str, list[tuple[str, array[float]]]] = field(default_factory=dict, repr=False)
    _numbered: dict[str, list[tuple[float, array[float]]]] = field(default_factory=dict, repr=False)

    def total(self, name: str, first: int, last: int) -> float:
        """Component ``name`` summed over minutes [first, last)."""
        column = self.sums.get(name)
        return 0.0 if column is None else column[last] - column[first]

    def named(self, prefix: str) -> list[tuple[str, array[float]]]:
        """The components whose names start with ``prefix`` (looked for once)."""
        found = self._by_prefix.get(prefix)
        if found is None:
            found = self._by_prefix[prefix] = [(n, c) for n, c in self.sums.items() if n.startswith(prefix)]
        return found

    def numbered(self, prefix: str) -> list[tuple[float, array[float]]]:
        """The components ``prefix<number>`` (a histogram's ``le`` buckets, ``drafts:k=N``) by their
        number, in order (read once)."""
        found = self._numbered.get(prefix)
        if found is None:
            found = []
            for name, column in self.named(prefix):
                try:
                    found.append((float(name[len(prefix) :]), column))
                except ValueError:
                    continue  # not a number: kept by no signal
            found.sort(key=lambda item: item[0])
            self._numbered[prefix] = found
        return found


def load(
    db: sqlite3.Connection, start: float, end: float, wanted: Wanted | None = None
) -> tuple[list[Recording], int]:
    """Every server's history over the minutes of [start, end) (``start`` on a minute), with the
    components ``wanted`` (None: all), and how many minutes the period has."""
    tables = Tables(db)
    wanted = wanted or Wanted(everything=True)
    count = max(0, math.ceil((end - start) / MINUTE))
    names = {
        int(r[0]): (str(r[1]), str(r[2]))
        for r in db.execute("SELECT id, instance, model FROM history_series")
    }
    kept: dict[int, list[tuple[int, str]]] = {}  # a layout's wanted components: (index, name)
    minutes: dict[int, dict[str, array[float]]] = {}  # each component's increase, minute by minute
    rows = db.execute(
        "SELECT series, minute, layout, data FROM history WHERE minute >= ? AND minute < ? ORDER BY series, minute",
        (int(start), int(start) + count * MINUTE),
    )
    for series, minute, layout, data in rows:
        picks = kept.get(layout)
        if picks is None:
            picks = kept[layout] = [(i, n) for i, n in enumerate(tables.keys(layout)) if n in wanted]
        values = json.loads(zlib.decompress(data))
        index = (int(minute) - int(start)) // MINUTE
        columns = minutes.setdefault(int(series), {})
        present = columns.get(PRESENT)
        if present is None:
            present = columns[PRESENT] = array("d", bytes(8 * count))
        present[index] = 1.0
        for i, name in picks:
            column = columns.get(name)
            if column is None:
                column = columns[name] = array("d", bytes(8 * count))
            column[index] = float(values[i])
    out = []
    for series, columns in minutes.items():
        instance, model = names[series]
        labels = {"instance": instance, "model_name": model} if model else {"instance": instance}
        recording = Recording(labels)
        for name, values in columns.items():
            recording.sums[name] = array("d", itertools.accumulate(values, initial=0.0))
        out.append(recording)
    return out, count


class HistorySource:
    """Signals from history, at the moment ``clock`` gives (see the module's doc)."""

    kind = "history"

    def __init__(
        self, recordings: Sequence[Recording], start: float, minutes: int, clock: Callable[[], float]
    ):
        self.recordings = list(recordings)
        self.start = start  # the period's first minute
        self.minutes = minutes
        self.clock = clock
        # Each query's shape (signal, group_by, match) -> its groups of servers, or why not.
        self._shapes: dict[
            tuple[object, ...], str | list[tuple[tuple[tuple[str, str], ...], list[Recording]]]
        ] = {}

    async def refresh(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def query_expr(self, expr: str) -> SourceResult:
        return SourceResult.failed(
            "history answers the catalog's signals only: replay a rule on PromQL from Prometheus"
        )

    def span(self, window: float) -> tuple[int, int]:
        """The minutes [first, last) a window of ``window`` seconds ending now reads."""
        last = math.floor((self.clock() - self.start) / MINUTE + 1e-9)
        first = last - max(1, math.ceil(window / MINUTE - 1e-9))
        return max(0, min(first, self.minutes)), max(0, min(last, self.minutes))

    async def query_signal(
        self,
        signal: Signal,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> SourceResult:
        shape = (signal.name, tuple(group_by), tuple(match), keep_intrinsic)
        grouping = self._shapes.get(shape)
        if grouping is None:
            grouping = self._shapes[shape] = self._group(signal, group_by, match, keep_intrinsic)
        if isinstance(grouping, str):
            return SourceResult.failed(grouping)
        first, last = self.span(window)
        if last <= first:
            return SourceResult()
        grouped: dict[tuple[tuple[str, str], ...], list[Recording]] = {}
        for key, members in grouping:
            present = [r for r in members if r.total(PRESENT, first, last) > 0]
            if present:  # a server not scraped in the window has no data
                grouped[key] = present
        return _answer(signal, grouped, first, last, match)

    def _group(
        self, signal: Signal, group_by: Sequence[str], match: Sequence[Matcher], keep_intrinsic: bool
    ) -> str | list[tuple[tuple[tuple[str, str], ...], list[Recording]]]:
        """The servers of each group a query of this shape reads (the same at every moment), or why
        history cannot answer it."""
        why = not_kept(signal)
        if why is not None:
            return why
        groups = signal.groups(group_by, keep_intrinsic)
        outer = [g for g in groups if g != POSITION or signal.kind is not Kind.PER_POSITION]
        unkept = [g for g in outer if g not in KEPT_LABELS]
        unkept += [m.label for m in match if m.label not in KEPT_LABELS and m.label != POSITION]
        if unkept:
            return f"history keeps {signal.name} by instance and model_name only, not by {', '.join(sorted(set(unkept)))}"
        selected = tuple(m for m in match if m.label != POSITION)
        grouped: dict[tuple[tuple[str, str], ...], list[Recording]] = {}
        for recording in self.recordings:
            if all_match(selected, recording.labels):
                key = tuple((g, recording.labels[g]) for g in outer if recording.labels.get(g, "") != "")
                grouped.setdefault(key, []).append(recording)
        return list(grouped.items())


def _sum(recordings: Sequence[Recording], name: str, first: int, last: int) -> float:
    return sum(r.total(name, first, last) for r in recordings)


def _answer(
    signal: Signal,
    grouped: Mapping[tuple[tuple[str, str], ...], list[Recording]],
    first: int,
    last: int,
    match: Sequence[Matcher],
) -> SourceResult:
    name = signal.name
    items: list[tuple[Mapping[str, str], float]] = []
    if signal.kind is Kind.CHAIN:
        counts = []
        for key, members in grouped.items():
            parts = _speculative(members, first, last)
            if parts is not None:
                counts.append(ChainCounts(dict(key), *parts))
        return chain_result(signal, counts, scale=1.0)
    for key, members in grouped.items():
        labels = dict(key)
        if name in _RATIOS:
            numerator, denominator = _RATIOS[name]
            below = _sum(members, denominator, first, last)
            if below > 0:
                items.append((labels, signal.offset + _sum(members, numerator, first, last) / below))
        elif name in _RATES:
            seconds = max(r.total(PRESENT, first, last) for r in members) * MINUTE
            items.append((labels, _sum(members, _RATES[name], first, last) / seconds))
        elif name in _GAUGES:
            part = _GAUGES[name]
            means = [
                r.total(f"{part}:sum", first, last) / r.total(f"{part}:n", first, last)
                for r in members
                if r.total(f"{part}:n", first, last) > 0
            ]
            if means:
                items.append((labels, max(means) if signal.combine == "max" else sum(means)))
        elif name in _HISTOGRAMS:
            prefix = f"{_HISTOGRAMS[name]}:le="
            buckets: dict[float, float] = {}
            for r in members:
                for upper, column in r.numbered(prefix):
                    buckets[upper] = buckets.get(upper, 0.0) + column[last] - column[first]
            assert signal.quantile is not None
            items.append((labels, bucket_quantile(signal.quantile, sorted(buckets.items()))))
        elif signal.kind is Kind.POSITIONS:
            k = max((_positions(r, first, last) for r in members), default=0)
            if k > 0:
                items.append((labels, float(k)))
        elif signal.kind is Kind.PER_POSITION:
            items.extend(_per_position(labels, members, first, last, match))
    return SourceResult.checked(signal, items)


def _drafts_by_k(recording: Recording, first: int, last: int) -> dict[int, float]:
    return {
        int(k): grown
        for k, column in recording.numbered(DRAFTS_BY_K)
        if k == int(k) and (grown := column[last] - column[first]) > 0
    }


def _positions(recording: Recording, first: int, last: int) -> int:
    by_k = _drafts_by_k(recording, first, last)
    if by_k:
        return max(by_k)
    return len(recording.named("pos:"))


def _speculative(
    members: Sequence[Recording], first: int, last: int
) -> tuple[float, float, float, float] | None:
    """The chain model's counts of a group: (S, S + F, draft tokens, drafts x k), F the drafts that
    ended in a rejection (all but those accepted whole, the last position's count), server by
    server as vLLM counts them, then summed."""
    successes = trials = tokens = expected = 0.0
    for r in members:
        drafts = r.total("drafts", first, last)
        if drafts <= 0:
            continue
        accepted = r.total("accepted", first, last)
        by_k = _drafts_by_k(r, first, last)
        k = max(by_k) if by_k else _positions(r, first, last)
        if k <= 0:
            continue
        whole = r.total(f"pos:{k - 1}", first, last)
        successes += accepted
        trials += accepted + drafts - whole
        tokens += r.total("draft_tokens", first, last)
        expected += sum(n * size for size, n in by_k.items()) if by_k else drafts * k
    return (successes, trials, tokens, expected) if trials > 0 else None


def _per_position(
    labels: Mapping[str, str], members: Sequence[Recording], first: int, last: int, match: Sequence[Matcher]
) -> list[tuple[Mapping[str, str], float]]:
    """Position i's rate: its accepted tokens over the drafts that had a position i."""
    accepted: dict[int, float] = {}
    made: dict[int, float] = {}
    for r in members:
        drafts = r.total("drafts", first, last)
        if drafts <= 0:
            continue
        by_k = _drafts_by_k(r, first, last)
        unknown = max(0.0, drafts - sum(by_k.values()))
        for i in range(_positions(r, first, last)):
            accepted[i] = accepted.get(i, 0.0) + r.total(f"pos:{i}", first, last)
            made[i] = made.get(i, 0.0) + unknown + sum(n for size, n in by_k.items() if size > i)
    out: list[tuple[Mapping[str, str], float]] = []
    for i in sorted(made):
        position = {**labels, POSITION: str(i)}
        if made[i] > 0 and all_match(tuple(m for m in match if m.label == POSITION), position):
            out.append((position, accepted[i] / made[i]))
    return out
