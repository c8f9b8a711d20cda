"""What the cases read: one window of a host's numbers, from the store's history, Prometheus or a
live scrape, in one shape (the history's per-minute components, see ``store/history.py`` and
``metrics/figures.py``), with the files and settings around them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.config.routing import RoutingConfig
from specguard.store.baseline import Baseline
from specguard.store.history import Span


@dataclass(frozen=True)
class Evidence:
    source: str  # "history", "prometheus" or "scrape": where the window's numbers come from
    start: float  # the window, epoch seconds
    end: float
    # vLLM servers: (instance, model) -> the window's spans, oldest first (components as history's).
    servers: Mapping[tuple[str, str], Sequence[Span]] = field(default_factory=dict)
    # The router's series (route:... components, per class and pool): router instance -> spans.
    routes: Mapping[str, Sequence[Span]] = field(default_factory=dict)
    baseline: Baseline | None = None
    routing: RoutingConfig | None = None
    serving_file: Path | None = None  # the serving file: target, draft, k
    bench: Mapping[str, Any] | None = None  # a `specguard bench --json` result, when given
    unit: str | None = None  # the vLLM systemd unit whose journal case 4 reads
    log_file: Path | None = None  # or vLLM's log file
    notes: tuple[str, ...] = ()  # what gathering could not read, said in the output
