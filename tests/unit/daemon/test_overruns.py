"""A round skipped because the one before was still running is counted every time and logged
once per episode: from the first skip until a round runs within its interval again."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from tests.unit.daemon.test_runtime import SlowSource, config, counter


async def until(what: str, check: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.02)


async def test_skipped_rounds_are_logged_once_per_episode_and_counted_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="specguard")
    path = config(tmp_path)  # rules every 200 ms
    daemon = Daemon(load(path), path)
    source = SlowSource(delay=0.7)  # each round takes 0.7 s: three ticks of four are skipped
    daemon.source = source
    await daemon.start(handle_signals=False)

    def said() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if "skipped a round" in r.getMessage() or "on schedule again" in r.getMessage()
        ]

    try:
        overruns = lambda: counter(daemon, "specguard_evaluation_overruns_total")  # noqa: E731
        await until("several rounds skipped", lambda: overruns() >= 4)
        first = said()  # every round takes 0.7 s: one episode, however many skips
        source.delay = 0.0  # on schedule again: the episode ends with the next round
        await until("the episode over", lambda: any("on schedule again" in line for line in said()))
        source.delay = 0.7  # a second episode (a busy machine may have made one more meanwhile)
        between, skipped = said(), overruns()
        await until("skipped again", lambda: overruns() >= skipped + 4)
        second = said()[len(between) :]
    finally:
        await daemon.shutdown()
    skip = "the 200ms rules skipped a round: the previous one was still running or late"
    assert first == [skip]
    assert len(second) <= 1 and set(second) <= {skip}
    # each episode said once, then its end once, with the rounds it skipped
    lines = said()
    assert all(line == skip for line in lines[0::2]), lines
    assert all(line.startswith("the 200ms rules are on schedule again: ") for line in lines[1::2]), lines
    assert overruns() >= 8 > len(lines)
