"""Item 11: runbook reaches on-call. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 11
KEY = "runbook"
TITLE = "runbook reaches on-call"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
