"""The weekly report's job, as the daemon runs it: handed in by whoever starts the daemon.

The report sits beside the daemon, not below it, so the daemon does not import it: the command line
(and the demo) hand in ``specguard.report.weekly``, which has these three functions. A daemon
started without it makes no report.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from specguard.config.routing import RoutingConfig
from specguard.store.baseline import Baseline
from specguard.store.database import Store


class WeeklyReports(Protocol):
    async def missed(self, store: Store, trigger: Any, now: float, retention: float) -> float | None:
        """The scheduled time of the last report the daemon missed while it was down, if any."""

    async def scheduled_report(
        self,
        store: Store,
        trigger: Any,
        scheduled: float,
        least: float,
        formats: Sequence[str],
        out_dir: Path,
        baseline: Baseline | None,
        deliver: Callable[[Any], Awaitable[None]] | None = None,
        remedies: Collection[str] = (),
        routing: RoutingConfig | None = None,
    ) -> Any:
        """Make the report scheduled for ``scheduled`` unless it was made already."""

    async def post(
        self, store: Store, actions: Mapping[str, Any], name: str, report: Any, out_dir: Path
    ) -> str:
        """Queue the report for the Slack action ``name``; what was said."""
