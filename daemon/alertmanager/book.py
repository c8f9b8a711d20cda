"""The alerts Alertmanager has told specguard about: the newest state of each, by fingerprint.

Alert rules read their series from here, on every delivery and on their schedule (so that
``keep_firing_for`` and ``for`` run their course between deliveries). A series is the rule's
``group_by`` labels taken from the alert (all of its labels by default); its value is how many of
its alerts are firing, so it breaches while one is and turns ok when the last one resolves.

Each alert rule gets an index, series by series, kept up to date as alerts arrive: a delivery
costs the series it touches, not the number of alerts known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from specguard.config.loading import LoadedRule
from specguard.engine.states import series_key
from specguard.rules.matchers import Matcher, all_match
from specguard.sources.base import SourceResult

# A resolved alert is kept this long, so its series reads "ok" (and resolves through
# keep_firing_for) before it goes quiet and is eventually forgotten.
RESOLVED_RETENTION = 3600.0


@dataclass(frozen=True)
class Receipt:
    """One state of one alert, as a delivery brought it (stored once per deduplication key)."""

    id: int
    delivery_id: int
    fingerprint: str
    status: str  # firing | resolved
    starts_at: str  # RFC 3339, UTC
    ends_at: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    received: float

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def newer_than(self, other: Receipt) -> bool:
        """A new episode (a later startsAt) or the resolution of the same one; never a late copy
        of a firing state after its resolution."""
        mine, theirs = datetime.fromisoformat(self.starts_at), datetime.fromisoformat(other.starts_at)
        if mine != theirs:
            return mine > theirs
        return self.status == "resolved" and other.status == "firing"


@dataclass
class _Series:
    labels: dict[str, str]
    alerts: dict[str, bool] = field(default_factory=dict)  # fingerprint -> firing

    @property
    def firing(self) -> float:
        return float(sum(self.alerts.values()))


_IndexKey = tuple[tuple[Matcher, ...], tuple[str, ...] | None]


class _Index:
    """One alert rule's series: which alerts each holds."""

    def __init__(self, matchers: tuple[Matcher, ...], group_by: tuple[str, ...] | None) -> None:
        self.matchers = matchers
        self.group_by = group_by
        self.series: dict[str, _Series] = {}
        self.of_alert: dict[str, str] = {}  # fingerprint -> series key

    def key_of(self, labels: Mapping[str, str]) -> str | None:
        """The series key of an alert with ``labels``, or None when the rule does not take it."""
        if not all_match(self.matchers, labels):
            return None
        if self.group_by is None:
            return series_key(labels)
        return series_key({g: labels[g] for g in self.group_by if labels.get(g, "") != ""})

    def put(self, receipt: Receipt) -> None:
        key = self.of_alert.get(receipt.fingerprint) or self.key_of(receipt.labels)
        if key is None:
            return
        self.of_alert[receipt.fingerprint] = key
        if key not in self.series:
            labels = (
                receipt.labels
                if self.group_by is None
                else {g: receipt.labels[g] for g in self.group_by if receipt.labels.get(g, "") != ""}
            )
            self.series[key] = _Series(dict(labels))
        self.series[key].alerts[receipt.fingerprint] = receipt.status == "firing"

    def drop(self, fingerprint: str) -> None:
        key = self.of_alert.pop(fingerprint, None)
        if key is None:
            return
        series = self.series[key]
        series.alerts.pop(fingerprint, None)
        if not series.alerts:
            del self.series[key]


def trigger_of(receipts: Iterable[Receipt], where: str) -> str:
    """``alertmanager: AcceptanceLow firing (delivery 12)``: what moved a rule, for its events."""
    seen = list(dict.fromkeys(f"{r.name or r.fingerprint} {r.status}" for r in receipts))
    shown = ", ".join(seen[:3]) + (f" and {len(seen) - 3} more" if len(seen) > 3 else "")
    return f"alertmanager: {shown} ({where})"


class AlertBook:
    def __init__(self, resolved_retention: float = RESOLVED_RETENTION) -> None:
        self.alerts: dict[str, Receipt] = {}
        self.resolved_retention = resolved_retention
        self._indexes: dict[_IndexKey, _Index] = {}

    def update(self, receipt: Receipt) -> bool:
        """Take a receipt in; returns whether it changed what is known (a stale one does not)."""
        known = self.alerts.get(receipt.fingerprint)
        if known is not None and not receipt.newer_than(known):
            return False
        self.alerts[receipt.fingerprint] = receipt
        for index in self._indexes.values():
            index.put(receipt)
        return True

    def load(self, receipts: Iterable[Receipt]) -> None:
        for receipt in receipts:
            self.update(receipt)

    def prune(self, now: float) -> int:
        """Forget alerts resolved longer ago than the retention; returns how many."""
        old = [
            fp
            for fp, r in self.alerts.items()
            if r.status == "resolved" and now - r.received > self.resolved_retention
        ]
        for fp in old:
            del self.alerts[fp]
            for index in self._indexes.values():
                index.drop(fp)
        return len(old)

    def _index(self, item: LoadedRule) -> _Index:
        alert = item.rule.alert
        assert alert is not None
        key: _IndexKey = (alert.matchers, item.rule.group_by)
        index = self._indexes.get(key)
        if index is None:  # a rule seen for the first time (or changed by a reload): built once
            index = self._indexes[key] = _Index(*key)
            for receipt in self.alerts.values():
                index.put(receipt)
        return index

    def keys(self, item: LoadedRule) -> set[str]:
        """The series keys of every group the rule has alerts for."""
        return set(self._index(item).series)

    def firing_keys(self, item: LoadedRule) -> set[str]:
        """The series keys with at least one firing alert."""
        return {key for key, series in self._index(item).series.items() if any(series.alerts.values())}

    def keys_of(self, item: LoadedRule, receipts: Iterable[Receipt]) -> set[str]:
        """The series keys the rule puts these alerts in (none for alerts it does not take)."""
        index = self._index(item)
        keys = (index.of_alert.get(r.fingerprint) or index.key_of(r.labels) for r in receipts)
        return {key for key in keys if key is not None}

    def query(self, item: LoadedRule, keys: Iterable[str] | None = None) -> SourceResult:
        """The rule's series (those of ``keys`` only, when given): firing alerts counted per group,
        0 for groups whose alerts all resolved."""
        index = self._index(item)
        chosen = (
            index.series.values() if keys is None else (index.series[k] for k in keys if k in index.series)
        )
        return SourceResult.of([(series.labels, series.firing) for series in chosen])

    def counts(self) -> dict[str, int]:
        out = {"firing": 0, "resolved": 0}
        for receipt in self.alerts.values():
            out[receipt.status] = out.get(receipt.status, 0) + 1
        return out
