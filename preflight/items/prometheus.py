"""Item 9: Prometheus scrapes, rules loaded, dashboard current. (Placeholder until the item is written: never shipped as is.)"""

from __future__ import annotations

from specguard.preflight.item import Answer, Context, Status

NUMBER = 9
KEY = "prometheus"
TITLE = "Prometheus scrapes, rules loaded, dashboard current"


async def check(ctx: Context) -> Answer:
    return Answer(Status.UNKNOWN, ("not written yet",))
