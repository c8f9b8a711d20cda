"""A Slack action's outbox emptied as the dispatcher's loop empties it: shared by the Slack tests."""

from __future__ import annotations

import asyncio
import time

from specguard.actions.slack import SlackAction
from specguard.store.database import Store
from specguard.store.memory import StoreMemory


async def deliver(slack_action: SlackAction, store: Store, until: float = 10.0) -> None:
    """Tick the action until its outbox is empty (as the dispatcher's loop does); fail after
    ``until`` seconds with what is still in it."""
    memory = StoreMemory(store, slack_action.name)
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        due = await slack_action.tick(memory)
        if due is None:
            return
        await asyncio.sleep(max(0.0, min(0.2, due - time.time())))
    raise AssertionError(f"the outbox was not emptied: {await memory.read('outbox')}")
