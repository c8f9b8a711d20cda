"""Item 10: weekly report scheduled and written. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 10
KEY = "report"
TITLE = "weekly report scheduled and written"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
