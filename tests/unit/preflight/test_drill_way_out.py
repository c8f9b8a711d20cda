"""The drill's way out (the restore, the record) is carried to its end however often it is cancelled:
a second Ctrl-C, and asyncio.run cancelling every task as it closes."""

from __future__ import annotations

import asyncio

import pytest

from specguard.preflight.drill.run import _carried


async def test_the_way_out_ends_through_repeated_cancellations() -> None:
    started, finished = [], []

    async def restore() -> str:
        started.append(1)
        await asyncio.sleep(0.2)
        finished.append(1)
        return "restored"

    said: list[tuple[str, bool]] = []

    async def drill() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            said.append(await _carried(restore))

    task = asyncio.create_task(drill())
    await asyncio.sleep(0.05)
    task.cancel()  # Ctrl-C
    await asyncio.sleep(0.05)
    task.cancel()  # again
    await asyncio.sleep(0.05)
    for other in asyncio.all_tasks() - {asyncio.current_task()}:
        other.cancel()  # asyncio.run closing: every task, the way out's own included
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [1] and len(started) == 2  # cut once, made again, to its end
    assert said == [("restored", True)]
