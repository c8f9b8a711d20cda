"""The ``preflight:`` section: what ``specguard preflight`` holds the host to, and where it looks.

Every key has a default, so a config without the section is checked on the playbook's numbers.
Paths are relative to the config file's directory.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specguard.common.paths import ConfigPath
from specguard.rules.durations import Duration

DAY = 86400.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DrillConfig(_Strict):
    """Item 7: the fallback drill (``--drill``), and how old the last one may be without it."""

    action: str | None = None  # the feature_flag action to engage (default: the only one)
    # The standard (non-speculative) servers' /metrics pages, whose request counters show traffic
    # arriving there; default: the servers of the routing section's fallback pool.
    standard_metrics: tuple[str, ...] = ()
    probe_requests: int = Field(4, ge=1, le=100)  # sent through the router when there is one
    timeout: Duration = Field(120.0, gt=0)  # for traffic to be seen moving
    max_age: Duration = Field(30 * DAY, gt=0)  # without --drill: the last drill's age


class PrometheusCheck(_Strict):
    """Item 9: Prometheus scrapes vLLM and specguard, has the exported rules, and the dashboard."""

    url: str | None = None  # default: sources.prometheus.url (none: that part is unknown)
    # The exported rules file as Prometheus loads it: compared with a fresh export (none: only the
    # rules API is asked).
    rules_file: ConfigPath | None = None
    # The dashboard file Grafana provisions (deploy/grafana/specguard.json as shipped, copied where
    # Grafana reads it): checked against the signal catalog (none: that part is unknown).
    grafana_dashboard: ConfigPath | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        parts = urlsplit(value) if value is not None else None
        if parts is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError(f"{value!r} is not an http(s) URL like http://127.0.0.1:9090")
        return value


class PreflightConfig(_Strict):
    """The checklist's numbers (the playbook's by default) and where its evidence lives."""

    min_acceptance: float = Field(0.55, gt=0, lt=1)  # item 4
    # items 4, 5 and 6: the production traffic judged, the last this long of the daemon's history
    acceptance_period: Duration = Field(7 * DAY, gt=0)
    min_speedup: float = Field(1.3, gt=0)  # item 5
    max_kv_cache_usage: float = Field(0.95, gt=0, le=1)  # item 6, at peak
    # item 6: a minute in which a server preempted more requests than this is a preemption burst
    max_preemptions_per_minute: int = Field(10, ge=0)
    baseline_max_age: Duration = Field(30 * DAY, gt=0)  # item 1
    drill: DrillConfig = DrillConfig()
    prometheus: PrometheusCheck = PrometheusCheck()
    # Item 11: the slack action --notify-test posts through and deletes from (default: the only one).
    slack: str | None = None
