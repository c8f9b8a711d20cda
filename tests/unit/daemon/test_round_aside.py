"""An evaluation round records what its events ask of the actions and goes on: the runs are carried
out beside it, one at a time per action, so an action that hangs holds back neither the rounds nor
/healthz; a stop still lets the run in progress finish within its grace."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import ClassVar

import pytest

from specguard.actions.base import Action, ActionContext, ActionParams, Outcome
from specguard.config.loading import load
from specguard.daemon import runtime
from specguard.daemon.runtime import Daemon
from tests.unit.daemon.test_runtime import SettableSource, config


class Hung(Action):
    """An action whose dependency never answers (up to its timeout)."""

    type = "log"
    started: ClassVar[int] = 0
    at_once: ClassVar[int] = 0
    most_at_once: ClassVar[int] = 0

    async def run(self, ctx: ActionContext) -> Outcome:
        Hung.started += 1
        Hung.at_once += 1
        Hung.most_at_once = max(Hung.most_at_once, Hung.at_once)
        try:
            await asyncio.sleep(3600)
        finally:
            Hung.at_once -= 1
        return Outcome(True, "done")


async def until(what: str, check: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.02)


async def test_an_action_that_hangs_holds_back_no_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "SHUTDOWN_GRACE", 1.0)
    path = config(tmp_path)  # rule `low` (< 0.5, actions: log), every 200 ms
    daemon = Daemon(load(path), path)
    source = SettableSource(0.2)  # fires at once: its log run hangs
    daemon.source = source
    daemon.dispatcher.actions = {"log": Hung("log", ActionParams(type="log", timeout=120.0))}
    await daemon.start(handle_signals=False)
    try:
        await until("the action started", lambda: Hung.started == 1)
        started = daemon.last_round
        rounds = set()
        source.value = 0.9  # resolves: another run of the same action, which waits for the first
        deadline = time.monotonic() + 30
        while len(rounds) < 10:
            assert time.monotonic() < deadline, f"rounds held back by the hung action: {sorted(rounds)}"
            assert daemon.health()[0], daemon.health()[1]
            if daemon.last_round != started:
                rounds.add(daemon.last_round)
            await asyncio.sleep(0.02)
        assert daemon.states["low"]['{"instance":"h:1"}'].state.value == "resolved"
        assert Hung.most_at_once == 1  # one run of an action at a time
    finally:
        await daemon.shutdown()  # cuts the hung run off after its grace: it resumes at the next start
