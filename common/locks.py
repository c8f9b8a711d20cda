"""Locks by name, one per event loop: what must not run twice at once (a change of one feature flag,
of one vLLM's k) across config reloads, which build new action instances."""

from __future__ import annotations

import asyncio
import weakref

_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def named_lock(name: str) -> asyncio.Lock:
    """The lock called ``name`` on the running event loop (an asyncio lock belongs to one loop)."""
    loop = asyncio.get_running_loop()
    return _LOCKS.setdefault(loop, {}).setdefault(name, asyncio.Lock())
