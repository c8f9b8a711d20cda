"""The alerts Alertmanager has told specguard about: the newest state of each, by fingerprint.

Alert rules read their series from here, on every delivery and on their schedule (so that
``keep_firing_for`` and ``for`` run their course between deliveries). A series is the rule's
``group_by`` labels taken from the alert (all of its labels by default); its value is how many of
its alerts are firing, so it breaches while one is and turns ok when the last one resolves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from daemon.loading import LoadedRule
from daemon.sources.base import SourceResult
from rules.matchers import all_match

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


class AlertBook:
    def __init__(self, resolved_retention: float = RESOLVED_RETENTION) -> None:
        self.alerts: dict[str, Receipt] = {}
        self.resolved_retention = resolved_retention

    def update(self, receipt: Receipt) -> bool:
        """Take a receipt in; returns whether it changed what is known (a stale one does not)."""
        known = self.alerts.get(receipt.fingerprint)
        if known is not None and not receipt.newer_than(known):
            return False
        self.alerts[receipt.fingerprint] = receipt
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
        return len(old)

    def matching(self, item: LoadedRule, labels: Mapping[str, str]) -> bool:
        alert = item.rule.alert
        return alert is not None and all_match(alert.matchers, labels)

    def query(self, item: LoadedRule) -> SourceResult:
        """The rule's series: firing alerts counted per group, 0 for groups whose alerts resolved."""
        groups = item.rule.group_by
        firing: dict[tuple[tuple[str, str], ...], float] = {}
        for receipt in self.alerts.values():
            if not self.matching(item, receipt.labels):
                continue
            labels = receipt.labels if groups is None else {g: receipt.labels.get(g, "") for g in groups}
            key = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
            firing[key] = firing.get(key, 0.0) + (1.0 if receipt.status == "firing" else 0.0)
        return SourceResult.of([(dict(key), count) for key, count in firing.items()])

    def counts(self) -> dict[str, int]:
        out = {"firing": 0, "resolved": 0}
        for receipt in self.alerts.values():
            out[receipt.status] = out.get(receipt.status, 0) + 1
        return out
