"""The checklist run: each item in the playbook's order, each within its own time limit. An item that
raises, or runs out of time, is unknown with what happened (never a traceback): the others still
run, and the record says which could not be checked."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from types import ModuleType

from specguard.preflight.item import Answer, Context, ItemResult, Status
from specguard.preflight.items import ITEMS

log = logging.getLogger("specguard.preflight")

DEFAULT_TIMEOUT = 120.0  # seconds an item may take, unless it says otherwise (``timeout(ctx)``)


def keys() -> tuple[str, ...]:
    return tuple(str(module.KEY) for module in ITEMS)


def item_timeout(module: ModuleType, ctx: Context) -> float:
    """An item's time limit: its own ``timeout(ctx)`` (the drill waits for traffic to move), else
    DEFAULT_TIMEOUT."""
    own: Callable[[Context], float] | None = getattr(module, "timeout", None)
    return float(own(ctx)) if own is not None else DEFAULT_TIMEOUT


async def check_one(module: ModuleType, ctx: Context) -> ItemResult:
    limit = item_timeout(module, ctx)
    started = time.monotonic()
    try:
        answer = await asyncio.wait_for(module.check(ctx), timeout=limit)
        if not isinstance(answer, Answer):
            raise TypeError(f"the item answered {type(answer).__name__}, not an Answer")
    except TimeoutError:
        answer = Answer(Status.UNKNOWN, (f"not finished within {limit:g} s: not checked",))
    except Exception as exc:  # an item's bug or a host fault: said, and the others still run
        log.debug("preflight item %s failed", module.KEY, exc_info=True)
        answer = Answer(Status.UNKNOWN, (f"the check failed: {type(exc).__name__}: {exc}",))
    log.debug("preflight item %s: %s in %.1f s", module.KEY, answer.status, time.monotonic() - started)
    return ItemResult(int(module.NUMBER), str(module.KEY), str(module.TITLE), answer)


async def run(
    ctx: Context, only: Sequence[str] = (), items: Sequence[ModuleType] | None = None
) -> list[ItemResult]:
    """Every item (or those of ``only``, in the checklist's order), one after the other: the drill
    changes what the others read, and two items never load the host at once."""
    chosen = [module for module in (ITEMS if items is None else items) if not only or module.KEY in only]
    return [await check_one(module, ctx) for module in chosen]


def passed(results: Sequence[ItemResult], allow_unknown: bool) -> bool:
    """Whether the checklist passes: every item passes, or is unknown when that is allowed."""
    ok = {Status.PASS, Status.UNKNOWN} if allow_unknown else {Status.PASS}
    return all(result.answer.status in ok for result in results)
