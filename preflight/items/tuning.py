"""Item 3: k tuned. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 3
KEY = "tuning"
TITLE = "k tuned"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
