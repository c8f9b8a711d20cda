"""The router's admin /specguard/metrics page as the routing contract spells it, built from counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specguard.rules.router_signals import ROUTE_BUCKETS as BUCKETS


@dataclass
class RouterCounts:
    """What the router has counted so far: durations per (class, pool), malformed bodies per reason."""

    durations: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)

    def observe(self, cls: str, pool: str, seconds: Sequence[float]) -> None:
        self.durations.setdefault((cls, pool), []).extend(seconds)

    def page(self) -> str:
        return router_page(self.durations, self.malformed)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def router_page(durations: Mapping[tuple[str, str], Sequence[float]], malformed: Mapping[str, int]) -> str:
    lines = ["# TYPE specguard_route_requests_total counter"]
    for (cls, pool), seen in sorted(durations.items()):
        lines.append(f'specguard_route_requests_total{{class="{cls}",pool="{pool}"}} {len(seen)}')
    lines.append("# TYPE specguard_route_request_duration_seconds histogram")
    for (cls, pool), seen in sorted(durations.items()):
        labels = f'class="{cls}",pool="{pool}"'
        for bound in (*BUCKETS, float("inf")):
            count = sum(1 for s in seen if s <= bound)
            lines.append(
                f'specguard_route_request_duration_seconds_bucket{{{labels},le="{_le(bound)}"}} {count}'
            )
        lines.append(f"specguard_route_request_duration_seconds_sum{{{labels}}} {sum(seen)}")
        lines.append(f"specguard_route_request_duration_seconds_count{{{labels}}} {len(seen)}")
    lines.append("# TYPE specguard_route_malformed_total counter")
    for reason, count in sorted(malformed.items()):
        lines.append(f'specguard_route_malformed_total{{reason="{reason}"}} {count}')
    lines.append("# TYPE specguard_route_fallback_engaged gauge")
    lines.append("specguard_route_fallback_engaged 0")
    return "\n".join(lines) + "\n"
