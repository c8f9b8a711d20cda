"""A round skipped because the one before was still running is counted every time and logged
once per episode: from the first skip until a round runs within its interval again."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from daemon.loading import load
from daemon.runtime import Daemon
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
    try:
        overruns = lambda: counter(daemon, "specguard_evaluation_overruns_total")  # noqa: E731
        await until("several rounds skipped", lambda: overruns() >= 4)
        source.delay = 0.0  # on schedule again: the episode ends with the next round
        queries = source.queries
        await until("rounds on time", lambda: source.queries >= queries + 5)
        first = overruns()
        source.delay = 0.7  # a second episode
        await until("skipped again", lambda: overruns() >= first + 3)
        skipped = overruns()
    finally:
        await daemon.shutdown()
    lines = [r.getMessage() for r in caplog.records if "skipped a round" in r.getMessage()]
    assert lines == ["the 200ms rules skipped a round: the previous one was still running or late"] * 2
    back = [r.getMessage() for r in caplog.records if "on schedule again" in r.getMessage()]
    assert len(back) == 1 and back[0].startswith("the 200ms rules are on schedule again: ")
    assert skipped >= 7
