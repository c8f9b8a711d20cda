"""Item 6: KV-cache headroom. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 6
KEY = "kv_cache"
TITLE = "KV-cache headroom"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
