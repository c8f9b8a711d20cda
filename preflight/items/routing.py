"""Item 8: routing rules render and nginx -t passes. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 8
KEY = "routing"
TITLE = "routing rules render and nginx -t passes"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
