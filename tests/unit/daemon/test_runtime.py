"""The daemon in-process: scheduling (overruns are counted, never stacked) and reload."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specguard.actions.base import Action, ActionContext, ActionParams, Outcome
from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.rules.signals import Signal
from specguard.sources.base import SourceResult
from specguard.sources.scrape import ScrapeSource


class SlowSource:
    """Answers 0.2 for every query, slower than the evaluation interval."""

    kind = "scrape"

    def __init__(self, delay: float):
        self.delay = delay
        self.running = 0
        self.most_at_once = 0
        self.queries = 0

    async def refresh(self) -> None:
        return None

    async def query_signal(
        self, signal: Signal, window: float, group_by: Sequence[str], *_: object
    ) -> SourceResult:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.queries += 1
        try:
            await asyncio.sleep(self.delay)
            return SourceResult.of([({"instance": "h:1"}, 0.2)])
        finally:
            self.running -= 1

    async def query_expr(self, expr: str) -> SourceResult:
        return SourceResult.failed("no")

    async def close(self) -> None:
        return None


def config(tmp_path: Path, condition: str = "< 0.5") -> Path:
    (tmp_path / "rules.yaml").write_text(
        f'rules:\n  - {{name: low, signal: acceptance_rate, condition: "{condition}", window: 10s}}\n'
    )
    path = tmp_path / "specguard.yaml"
    path.write_text("server: {port: 0}\nstate_dir: state\ninterval: 200ms\nrules: [rules.yaml]\n")
    return path


def counter(daemon: Daemon, name: str) -> float:
    total = 0.0
    for metric in daemon.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name:
                total += sample.value
    return total


async def test_an_evaluation_that_overruns_its_interval_is_counted_not_stacked(tmp_path: Path) -> None:
    path = config(tmp_path)
    daemon = Daemon(load(path), path)
    source = SlowSource(delay=0.7)
    daemon.source = source
    await daemon.start()
    try:
        for _ in range(400):  # three slow rounds, however long a busy machine makes them
            if source.queries >= 3:
                break
            await asyncio.sleep(0.05)
    finally:
        await daemon.shutdown()
    assert source.queries >= 3
    assert source.most_at_once == 1  # never two rounds at once
    # each round held the schedule for 0.7 s, over three 200 ms ticks: the ticks were skipped, counted
    assert counter(daemon, "specguard_evaluation_overruns_total") >= 2
    assert daemon.states["low"]['{"instance":"h:1"}'].state.value == "firing"


async def test_reload_applies_a_valid_config_and_keeps_the_old_one_otherwise(tmp_path: Path) -> None:
    path = config(tmp_path)
    daemon = Daemon(load(path), path)
    daemon.source = SlowSource(delay=0)
    await daemon.start()
    try:
        (tmp_path / "rules.yaml").write_text("rules: [{name: low, signal: nope, condition: '< 1'}]\n")
        assert await daemon.reload() is False
        assert daemon.loaded.rules[0].rule.signal == "acceptance_rate"

        config(tmp_path, condition="< 0.1")
        assert await daemon.reload() is True
        assert str(daemon.loaded.rules[0].rule.condition) == "< 0.1"
        await daemon.evaluate_round()
        assert daemon.states["low"]['{"instance":"h:1"}'].state.value == "resolved"
    finally:
        await daemon.shutdown()
    assert counter(daemon, "specguard_config_reloads_total") == 2


class SlowLog(Action):
    """Stands in for an action that takes a while (a restart, a Slack call)."""

    type = "log"
    started = 0
    finished = 0

    async def run(self, ctx: ActionContext) -> Outcome:
        SlowLog.started += 1
        await asyncio.sleep(1.0)
        SlowLog.finished += 1
        return Outcome(True, "done")


async def test_a_stop_lets_the_action_in_progress_finish(tmp_path: Path) -> None:
    path = config(tmp_path)
    daemon = Daemon(load(path), path)
    daemon.source = SlowSource(delay=0)
    daemon.dispatcher.actions = {"log": SlowLog("log", ActionParams(type="log"))}
    await daemon.start()
    for _ in range(400):
        if SlowLog.started:
            break
        await asyncio.sleep(0.05)
    assert SlowLog.started == 1 and SlowLog.finished == 0
    await daemon.shutdown()
    assert SlowLog.finished == 1
    store = Daemon(load(path), path).store
    await store.open()
    try:
        runs = await store.action_runs()
    finally:
        await store.close()
    assert [(r["status"], r["detail"]) for r in runs] == [("ok", "done")]


def test_health_follows_what_each_interval_is_due_to_do() -> None:
    from specguard.daemon.status import health

    # Rules every 60 s on a config whose interval is 5 s: a round 100 s ago is on time.
    ok, body = health({60.0: 1000.0}, started_at=900.0, now=1100.0, rules=1)
    assert (ok, body["status"], body["last_evaluation"]) == (True, "ok", 1000.0)
    late, body = health({60.0: 1000.0, 5.0: 1000.0}, started_at=900.0, now=1100.0, rules=2)
    assert not late
    assert body["reason"] == "the 5s rules last ran 100s ago (allowed 15s)"
    # A schedule that never ran counts from the start.
    assert health({15.0: None}, started_at=1000.0, now=1045.0, rules=1)[0]
    assert not health({15.0: None}, started_at=1000.0, now=1046.0, rules=1)[0]


class SettableSource(SlowSource):
    """Answers whatever ``value`` says, at once."""

    def __init__(self, value: float) -> None:
        super().__init__(delay=0)
        self.value = value

    async def query_signal(
        self, signal: Signal, window: float, group_by: Sequence[str], *_: object
    ) -> SourceResult:
        return SourceResult.of([({"instance": "h:1"}, self.value)])


async def test_a_store_that_cannot_write_freezes_states_says_so_once_and_recovers_without_losing_a_transition(
    tmp_path: Path, caplog: Any
) -> None:
    path = config(tmp_path)
    daemon = Daemon(load(path), path)
    source = SettableSource(0.2)
    daemon.source = source
    await daemon.start(handle_signals=False)
    try:
        assert daemon.scheduler is not None
        daemon.scheduler.pause()  # the test runs the rounds itself, one at a time
        while daemon.busy:
            await asyncio.sleep(0.01)
        await daemon.evaluate_round()
        assert daemon.states["low"]['{"instance":"h:1"}'].state.value == "firing"

        await daemon.store.refuse_writes(True)
        source.value = 0.9  # the rule should resolve, but that cannot be written
        for _ in range(3):
            await daemon.evaluate_round()
        frozen = daemon.states["low"]['{"instance":"h:1"}'].state.value
        healthy, health = daemon.health()
        status = daemon.status()
        errors = [r for r in caplog.records if "cannot write the state store" in r.getMessage()]

        await daemon.store.refuse_writes(False)
        await daemon.evaluate_round()
        after = daemon.states["low"]['{"instance":"h:1"}'].state.value
        recovered = daemon.health()[0]
        events = await daemon.store.events("low")
    finally:
        await daemon.shutdown()

    assert frozen == "firing"  # no state invented: the resolve was not written, so it did not happen
    assert not healthy and health["status"] == "store_failing"
    assert "attempt to write a readonly database" in health["reason"]
    assert "attempt to write a readonly database" in (status["store"]["error"] or "")
    assert len(errors) == 1 and not errors[0].exc_info  # said once, no traceback
    assert counter(daemon, "specguard_store_errors_total") >= 3
    assert (after, recovered) == ("resolved", True)
    assert [e["kind"] for e in reversed(events)] == ["pending", "firing", "resolved"]  # none lost, none twice


async def test_a_reload_that_changes_the_targets_scrapes_the_new_ones(tmp_path: Path) -> None:
    path = config(tmp_path)
    path.write_text(path.read_text() + "sources: {scrape: {targets: [http://127.0.0.1:9/metrics]}}\n")
    daemon = Daemon(load(path), path)
    await daemon.start()
    try:
        first = daemon.source
        assert isinstance(first, ScrapeSource) and first.targets == ("http://127.0.0.1:9/metrics",)
        path.write_text(path.read_text().replace("127.0.0.1:9/", "127.0.0.1:7/"))
        assert await daemon.reload() is True
        assert isinstance(daemon.source, ScrapeSource)
        assert daemon.source.targets == ("http://127.0.0.1:7/metrics",)
        assert daemon.source is not first
    finally:
        await daemon.shutdown()


class BrokenSource(SlowSource):
    """Every query raises: a bug in a source, not a failed scrape."""

    async def query_signal(
        self, signal: Signal, window: float, group_by: Sequence[str], *_: object
    ) -> SourceResult:
        raise RuntimeError("source bug")


async def test_a_rule_whose_evaluation_raises_does_not_hold_the_start_forever(tmp_path: Path) -> None:
    # READY=1 waits for every rule's first evaluation; one that raises has been evaluated too.
    path = config(tmp_path)
    daemon = Daemon(load(path), path)
    daemon.source = BrokenSource(delay=0)
    await asyncio.wait_for(daemon.start(handle_signals=False), timeout=20)
    try:
        assert daemon.rule_errors["low"] == "evaluation failed: RuntimeError: source bug"
    finally:
        await daemon.shutdown()
