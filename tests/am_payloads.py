"""Alertmanager webhook payloads (version 4) as Alertmanager 0.25-0.34 sends them, for tests and
benchmarks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"  # a firing alert's endsAt


def fingerprint(labels: Mapping[str, str]) -> str:
    """16 hex characters identifying a label set, like Alertmanager's."""
    text = json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def alert(
    labels: Mapping[str, str],
    status: str = "firing",
    starts_at: str = "2026-12-03T10:00:00.123456789Z",
    ends_at: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": dict(labels),
        "annotations": {"summary": "acceptance below 0.5"},
        "startsAt": starts_at,
        "endsAt": ends_at or (ZERO_TIME if status == "firing" else "2026-12-03T10:05:00Z"),
        "generatorURL": "http://prometheus:9090/graph?g0.expr=x",
        "fingerprint": fingerprint(labels),
        **extra,
    }


def message(
    *alerts: dict[str, Any], group_key: str = '{}:{alertname="AcceptanceLow"}', **extra: Any
) -> dict[str, Any]:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {
        "receiver": "specguard",
        "status": status,
        "alerts": list(alerts),
        "groupLabels": {"alertname": "AcceptanceLow"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        **extra,
    }
