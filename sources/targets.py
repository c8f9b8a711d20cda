"""A scrape target's name and state: the ``instance`` label it reports under (host:port, as
Prometheus's default), two targets that would report as one, and what its last scrapes came to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit


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
