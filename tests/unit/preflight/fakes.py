"""Checklist items made up for the runner's and the command line's tests, and a context for them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

from specguard.config.loading import load
from specguard.preflight.item import Answer, Context, Status


def item(number: int, key: str, check: Callable[[Context], Awaitable[object]],
         timeout: float | None = None) -> ModuleType:  # fmt: skip
    module = ModuleType(f"fake_{key}")
    module.NUMBER, module.KEY, module.TITLE = number, key, f"the {key} item"  # type: ignore[attr-defined]
    module.check = check  # type: ignore[attr-defined]
    if timeout is not None:
        module.timeout = lambda ctx: timeout  # type: ignore[attr-defined]
    return module


def answering(
    status: Status, *evidence: str, fix: str | None = None
) -> Callable[[Context], Awaitable[Answer]]:
    async def check(ctx: Context) -> Answer:
        return Answer(status, evidence, fix)

    return check


async def raising(ctx: Context) -> Answer:
    raise RuntimeError("the flag API said 500")


async def sleeping(ctx: Context) -> Answer:
    await asyncio.sleep(30)
    return Answer(Status.PASS, ())


def context(tmp: Path) -> Context:
    return Context(loaded=load(None), config_file=None, store_file=tmp / "none.db", now=1_800_000_000.0)
