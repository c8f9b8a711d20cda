"""The HTTP server's connection cap: the oldest connections make room for new ones."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from specguard.daemon.server import start_server


class Observed:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.evicted = 0

    def health(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "ok"}

    def status(self) -> dict[str, Any]:
        return {"rules": []}

    async def overview(self) -> dict[str, Any]:
        return self.status()

    def connections_evicted(self) -> None:
        self.evicted += 1


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 0.5) == b""  # EOF
    except TimeoutError:
        return False


async def test_past_the_cap_the_oldest_connections_are_closed_once_each_and_counted() -> None:
    observed = Observed()
    runner, port = await start_server(observed, "127.0.0.1", 0, max_connections=3)
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        # Connections that never send a request, in one burst: several are accepted in one turn
        # of the event loop, before the ones closed for room are gone from the server's list.
        idle += await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(10)))
        for _ in range(500):  # until the server has caught up with every accept (at most 10 s)
            if observed.evicted >= 7:
                break
            await asyncio.sleep(0.02)
        assert observed.evicted == 7
        assert runner.server is not None and len(runner.server.connections) <= 3
        closed = [await closed_by_server(reader) for reader, _ in idle]
        assert sum(closed) == 7  # which seven is the order of accept, not of connect
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz") as answer,
        ):
            assert answer.status == 200  # a new client is served: it evicts the oldest idle one
        assert observed.evicted == 8
    finally:
        for _, writer in idle:
            writer.close()
        await runner.cleanup()
