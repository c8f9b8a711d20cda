"""A source for a daemon run in the test's process: every signal reads ``values`` (instance ->
value), whenever asked, so a test moves a rule by setting a number."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from specguard.rules.signals import Signal
from specguard.sources.base import SourceResult

INSTANCE = "vllm-a:8000"


class Readings:
    kind = "scrape"

    def __init__(self, value: float = 0.8) -> None:
        self.values = {INSTANCE: value}
        self.queries = 0
        self.delay = 0.0  # each query takes this long

    @property
    def value(self) -> float:
        return self.values[INSTANCE]

    @value.setter
    def value(self, value: float) -> None:
        self.values = {INSTANCE: value}

    async def refresh(self) -> None:
        return None

    async def query_signal(
        self, signal: Signal, window: float, group_by: Sequence[str], *_: object
    ) -> SourceResult:
        self.queries += 1
        await asyncio.sleep(self.delay)
        return SourceResult.of([({"instance": name}, value) for name, value in self.values.items()])

    async def query_expr(self, expr: str) -> SourceResult:
        return SourceResult.failed("this source reads the catalog's signals only")

    async def close(self) -> None:
        return None
