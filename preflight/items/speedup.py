"""Item 5: speedup over plain decoding. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 5
KEY = "speedup"
TITLE = "speedup over plain decoding"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
