"""What the daemon is built from, config by config: the source, the scrape that
keeps history under the Prometheus source, and how long and how often the scrape source keeps and
takes its samples."""

from __future__ import annotations

from typing import Any

from specguard.config.loading import Loaded
from specguard.config.schema import Config
from specguard.daemon.evaluation import window_of
from specguard.sources.base import Source

HISTORY_SCRAPE_EVERY = 15.0  # seconds, for history_source


def make_source(loaded: Loaded) -> Source:
    """The configured source. Prometheus is imported only when it is used."""
    config, retention = loaded.config, retention_for(loaded)
    if config.sources.prometheus is not None:
        from specguard.sources.prometheus import PrometheusSource

        p = config.sources.prometheus
        return PrometheusSource(
            p.url, p.timeout, bearer_token=loaded.prometheus_token, verify_tls=p.verify_tls
        )
    from specguard.sources.scrape import ScrapeSource

    scrape = config.scrape
    return ScrapeSource(
        scrape.urls,
        timeout=scrape.timeout,
        retention=retention,
        names=scrape.names,
        max_page_bytes=scrape.max_page_size,
    )


def make_history_source(config: Config) -> Any:
    """The scrape of ``history.scrape`` when the Prometheus source leaves history without samples."""
    if config.sources.prometheus is None or config.history.scrape is None or not config.history.enabled:
        return None
    from specguard.sources.scrape import ScrapeSource

    scrape = config.history.scrape
    return ScrapeSource(
        scrape.urls, timeout=scrape.timeout, retention=4 * HISTORY_SCRAPE_EVERY, names=scrape.names,
        max_page_bytes=scrape.max_page_size,
    )  # fmt: skip


def _windows(loaded: Loaded) -> list[float]:
    """The window each enabled rule reads (a detector's is its interval)."""
    return [window_of(r, loaded.config.interval) for r in loaded.enabled_rules()] or [300.0]


def retention_for(loaded: Loaded) -> float:
    """How long the scrape source must keep samples: the longest window, plus slack."""
    return max(_windows(loaded)) + 2 * loaded.config.interval + 30


def scrape_every(loaded: Loaded) -> float:
    """Scrape often enough that every window holds several samples."""
    return max(1.0, min(loaded.config.interval, min(_windows(loaded)) / 4))
