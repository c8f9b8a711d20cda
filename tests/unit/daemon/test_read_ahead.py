"""A round over a source whose answers come over the network (``reads_ahead``, as the Prometheus
source's): every rule's reading asked for at once at the round's start, each rule then judged and
stored in turn on its own answer; a source answering from memory is read rule by rule, as before."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.rules.signals import Signal
from specguard.sources.base import SourceResult

RULES = ("low_a", "low_b", "low_c")


class NetworkSource:
    """Answers each signal after ``release`` is set, counting the queries in flight at once; each
    rule's value differs (the window tells them apart), so that a rule judged on another's reading
    shows."""

    kind = "prometheus"

    def __init__(self, reads_ahead: bool) -> None:
        self.reads_ahead = reads_ahead
        self.release = asyncio.Event()
        self.running = 0
        self.most_at_once = 0
        self.asked: list[float] = []
        self.value = {10.0: 0.1, 20.0: 0.2, 30.0: 0.3}

    async def refresh(self) -> None:
        return None

    async def query_signal(
        self, signal: Signal, window: float, group_by: Sequence[str], *_: object
    ) -> SourceResult:
        self.asked.append(window)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.release.wait()
            return SourceResult.of([({"instance": "h:1"}, self.value[window])])
        finally:
            self.running -= 1

    async def query_expr(self, expr: str) -> SourceResult:
        return SourceResult.failed("no")

    async def close(self) -> None:
        return None


def daemon_with(tmp_path: Path, source: NetworkSource) -> Daemon:
    rules = "\n".join(
        f'  - {{name: {name}, signal: acceptance_rate, condition: "< 0.5", window: {10 * (i + 1)}s}}'
        for i, name in enumerate(RULES)
    )
    (tmp_path / "rules.yaml").write_text(f"rules:\n{rules}\n")
    path = tmp_path / "specguard.yaml"
    path.write_text("server: {port: 0}\nstate_dir: state\nrules: [rules.yaml]\n")
    daemon = Daemon(load(path), path)
    daemon.source = source  # type: ignore[assignment]
    return daemon


@contextlib.asynccontextmanager
async def round_waiting(daemon: Daemon) -> AsyncIterator[asyncio.Task[None]]:
    """A round started on an open store, given time to ask for what it asks before any answer."""
    await daemon.store.open()
    try:
        evaluating = asyncio.create_task(daemon.evaluate_round())
        for _ in range(50):
            await asyncio.sleep(0.01)
        yield evaluating
    finally:
        await daemon.store.close()


@pytest.mark.parametrize("reads_ahead", [True, False])
async def test_each_rule_is_judged_on_its_own_reading_asked_at_once_or_in_turn(
    tmp_path: Path, reads_ahead: bool
) -> None:
    source = NetworkSource(reads_ahead)
    daemon = daemon_with(tmp_path, source)
    async with round_waiting(daemon) as evaluating:
        waiting = source.running
        source.release.set()
        await evaluating
    assert waiting == (3 if reads_ahead else 1) and source.most_at_once == waiting
    assert sorted(source.asked) == [10.0, 20.0, 30.0]  # each rule asked once
    values = {name: [s.value for s in daemon.states[name].values()] for name in RULES}
    assert values == {"low_a": [0.1], "low_b": [0.2], "low_c": [0.3]}


async def test_a_rule_judged_since_its_reading_was_asked_is_read_again_never_judged_on_the_older_one(
    tmp_path: Path,
) -> None:
    """A delivery that evaluates a rule while the round waits: the round's reading of it is older
    than what the rule was last judged on, so the round reads it again."""
    source = NetworkSource(reads_ahead=True)
    daemon = daemon_with(tmp_path, source)
    async with round_waiting(daemon) as evaluating:
        assert source.running == 3
        item = next(i for i in daemon.loaded.enabled_rules() if i.name == "low_c")
        source.value[30.0] = 0.35
        between = asyncio.create_task(daemon.rounds.evaluate_one(item, trigger="alertmanager"))
        await asyncio.sleep(0.05)
        source.release.set()
        await asyncio.gather(evaluating, between)
    # low_c: asked at the round's start, then by the delivery's evaluation, then again by the round
    assert sorted(source.asked) == [10.0, 20.0, 30.0, 30.0, 30.0]
    assert [s.value for s in daemon.states["low_c"].values()] == [0.35]


async def test_a_round_cut_off_leaves_no_reading_running(tmp_path: Path) -> None:
    source = NetworkSource(reads_ahead=True)
    daemon = daemon_with(tmp_path, source)
    async with round_waiting(daemon) as evaluating:
        assert source.running == 3
        evaluating.cancel()
        await asyncio.gather(evaluating, return_exceptions=True)
        for _ in range(10):
            await asyncio.sleep(0)
        assert source.running == 0
