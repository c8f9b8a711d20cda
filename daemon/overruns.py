"""Rounds and scrapes skipped because the previous one was still running (a slow source, a store
that stalls): each counted, and a late round logged once per episode, from the first skip until a
round of that interval runs within its interval again (then said once, with how many were
skipped)."""

from __future__ import annotations

import logging

from specguard.metrics.registry import DaemonMetrics

log = logging.getLogger("specguard")


class Overruns:
    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics
        self._late: dict[str, int] = {}  # interval label -> rounds skipped in the episode under way

    def skipped(self, job: str) -> None:
        """The scheduler skipped a run of ``job`` (``scrape``, ``evaluate-<interval>``)."""
        if job == "scrape":  # a slow target held the previous scrape: not a late round
            self.metrics.scrapes_skipped.inc()
            log.debug("scrape skipped: the previous one is still running")
            return
        if not job.startswith("evaluate-"):
            return
        interval = job.removeprefix("evaluate-")
        self.metrics.overruns.labels(interval).inc()
        if interval in self._late:
            self._late[interval] += 1
            return
        self._late[interval] = 1
        log.warning("the %s rules skipped a round: the previous one was still running or late", interval)

    def ran(self, interval: str, took: float, every: float | None) -> None:
        """A round of ``interval`` took ``took`` seconds: within ``every``, an episode is over."""
        if every is None or took >= every or interval not in self._late:
            return
        skipped = self._late.pop(interval)
        log.info("the %s rules are on schedule again: %d round(s) skipped", interval, skipped)
