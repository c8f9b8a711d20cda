"""specguard's own /metrics for dashboards: what the actions hold (a fallback engaged, vLLM's k),
read from the store at start and after every change whoever made it, and the loaded baseline."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from specguard.actions.base import Action, Holding
from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.vllm_restart import VllmRestartAction, VllmRestartParams
from specguard.actions.vllm_restart.change import STATE_KEY as LADDER_KEY
from specguard.config.loading import LoadedRule, load
from specguard.daemon.runtime import Daemon
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.schema import Rule
from specguard.store.baseline import parse_baseline
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from specguard.store.records import Event, SeriesState, State

SERIES = '{"instance":"h:8000"}'
LABELS = {"instance": "h:8000"}


def fallback(tmp_path: Path) -> FeatureFlagAction:
    params = FeatureFlagParams.model_validate(
        {
            "type": "feature_flag",
            "quiet_period": 0,
            "file": {
                "path": str(tmp_path / "flags.json"),
                "engage": {"speculative": False},
                "restore": {"speculative": True},
            },
        }
    )
    return FeatureFlagAction("fallback", params)


def ladder(tmp_path: Path, env: str | None) -> VllmRestartAction:
    path = tmp_path / "speculative.env"
    if env is not None:
        path.write_text(env)
    params = VllmRestartParams.model_validate(
        {"type": "vllm_restart", "ladder": [4, 2, 0], "env_file": {"path": str(path)}, "command": ["true"]}
    )
    return VllmRestartAction("fewer-tokens", params)


def value(metrics: DaemonMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def until(what: str, check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving(store: Store, actions: dict[str, Action]) -> AsyncIterator[Dispatcher]:
    """A dispatcher carrying out runs as the daemon's does (its serve loop running)."""
    d = Dispatcher(store, actions, False, DaemonMetrics(), rules=[rule()])
    task = asyncio.get_running_loop().create_task(d.serve())
    try:
        yield d
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def rule() -> LoadedRule:
    raw = {"name": "low", "signal": "acceptance_rate", "condition": "< 0.5", "actions": ["fallback"]}
    return LoadedRule(Rule.model_validate(raw), "rules.yaml", 2)


async def commit(store: Store, d: Dispatcher, kind: State, previous: State) -> None:
    event = Event("low", SERIES, LABELS, kind, previous, time.time(), 0.3, 0.5)
    state = SeriesState(labels=LABELS, state=kind, since=event.at)
    await d.run(await store.commit_evaluation("low", {SERIES: state}, [d.record(rule(), event)]))


def engaged(d: Dispatcher) -> float | None:
    return value(d.metrics, "specguard_fallback_engaged", action="fallback")


async def test_a_firing_that_engages_the_fallback_shows_1_and_its_restore_shows_0(
    store: Store, tmp_path: Path
) -> None:
    async with serving(store, {"fallback": fallback(tmp_path)}) as d:
        await until("a flag never engaged reads 0", lambda: engaged(d) == 0)
        await commit(store, d, State.FIRING, State.PENDING)
        await until("the engaged flag reads 1", lambda: engaged(d) == 1)
        await commit(store, d, State.RESOLVED, State.FIRING)
        await until("the restored flag reads 0", lambda: engaged(d) == 0)
    runs = await store.action_runs()
    assert sorted((r["mode"], r["status"]) for r in runs) == [("restore", "ok"), ("run", "ok")]
    assert b'specguard_fallback_engaged{action="fallback"} 0.0' in generate_latest(d.metrics.registry)


async def test_after_a_restart_the_fallback_gauge_reads_the_engaged_flag_from_the_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "specguard.db"
    first = Store(path)
    await first.open()
    async with serving(first, {"fallback": fallback(tmp_path)}) as d:
        await commit(first, d, State.FIRING, State.PENDING)
        await until("the engaged flag reads 1", lambda: engaged(d) == 1)
    await first.close()

    second = Store(path)
    await second.open()
    try:
        # A new process: fresh metrics, and no run at all (the rule is still firing).
        async with serving(second, {"fallback": fallback(tmp_path)}) as d:
            await until("the engaged flag reads 1 after the restart", lambda: engaged(d) == 1)
    finally:
        await second.close()


async def test_a_flag_held_outside_the_dispatcher_shows_at_once(store: Store, tmp_path: Path) -> None:
    action = fallback(tmp_path)
    async with serving(store, {"fallback": action}) as d:
        await until("a flag never engaged reads 0", lambda: engaged(d) == 0)
        # As a vllm_restart's drain holds it: through the flag's memory, not through a run of its own.
        outcome = await action.engage_for(StoreMemory(store, "fallback"), "vllm_restart:fewer-tokens")
        assert outcome.ok, outcome.detail
        await until("the drained flag reads 1", lambda: engaged(d) == 1)


async def test_speculative_tokens_come_from_the_config_file_until_specguard_verified_a_change(
    store: Store, tmp_path: Path
) -> None:
    env = 'VLLM_SPECULATIVE_CONFIG=\'{"method":"eagle3","model":"d","num_speculative_tokens":4}\'\n'
    action = ladder(tmp_path, env)
    memory = StoreMemory(store, "fewer-tokens")
    assert await action.holding(memory) == Holding(speculative_tokens=4)

    async with serving(store, {"fewer-tokens": action}) as d:

        def k() -> float | None:
            return value(d.metrics, "specguard_speculative_tokens", action="fewer-tokens")

        await until("k read from the file", lambda: k() == 4)
        await memory.update(LADDER_KEY, lambda state: {**(state or {}), "k": 2})  # a verified step down
        await until("k as last verified", lambda: k() == 2)
        assert value(d.metrics, "specguard_fallback_engaged", action="fewer-tokens") is None


async def test_speculative_tokens_are_0_when_the_file_turns_speculation_off_and_unknown_without_a_file(
    store: Store, tmp_path: Path
) -> None:
    memory = StoreMemory(store, "fewer-tokens")
    assert await ladder(tmp_path, "VLLM_SPECULATIVE_CONFIG=\n").holding(memory) == Holding(
        speculative_tokens=0
    )
    (tmp_path / "speculative.env").unlink()
    assert await ladder(tmp_path, None).holding(memory) == Holding()
    assert await ladder(tmp_path, "VLLM_SPECULATIVE_CONFIG='{not json'\n").holding(memory) == Holding()


async def test_an_action_a_reload_removes_leaves_no_gauge_behind(store: Store, tmp_path: Path) -> None:
    async with serving(store, {"fallback": fallback(tmp_path)}) as d:
        await until("the flag's gauge is shown", lambda: engaged(d) == 0)
        d.actions = {}
        await until("the gauge is gone", lambda: engaged(d) is None)


async def test_an_action_whose_holding_cannot_be_read_keeps_its_last_value(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(FeatureFlagAction):
        fail = False

        async def holding(self, memory: Any) -> Holding:
            if self.fail:
                raise RuntimeError("unreadable")
            return await super().holding(memory)

    action = Broken("fallback", fallback(tmp_path).params)
    d = Dispatcher(store, {"fallback": action}, False, DaemonMetrics())
    await d.show_holdings()
    assert engaged(d) == 0
    action.fail = True
    await d.show_holdings()
    assert engaged(d) == 0
    assert "action fallback: cannot read what it holds: RuntimeError: unreadable" in caplog.text


def test_every_kind_of_holding_has_its_gauge() -> None:
    assert set(DaemonMetrics().holdings) == {field.name for field in dataclasses.fields(Holding)}


BASELINE = {
    "version": 2,
    "measured_at": "2026-12-01T00:00:00Z",
    "entries": [
        {"model": "llama", "instance": "10.0.0.7:8000", "signals": {"ttft_p95": 0.25}},
        {"model": "llama", "signals": {"ttft_p95": 0.2, "e2e_latency_p95": 1.84}},
        {"signals": {"e2e_latency_p95": 1.5}},
    ],
}


def test_the_baseline_gauge_shows_every_entry_with_empty_labels_for_what_it_does_not_name() -> None:
    metrics = DaemonMetrics()
    metrics.show_baseline(parse_baseline(BASELINE))
    shown = {
        (s.labels["model_name"], s.labels["instance"], s.labels["signal"]): s.value
        for family in metrics.registry.collect()
        if family.name == "specguard_baseline"
        for s in family.samples
    }
    assert shown == {
        ("llama", "10.0.0.7:8000", "ttft_p95"): 0.25,
        ("llama", "", "ttft_p95"): 0.2,
        ("llama", "", "e2e_latency_p95"): 1.84,
        ("", "", "e2e_latency_p95"): 1.5,
    }
    metrics.show_baseline(None)
    assert value(metrics, "specguard_baseline", model_name="", instance="", signal="e2e_latency_p95") is None


async def test_the_daemon_shows_its_baseline_and_a_reload_replaces_it(tmp_path: Path) -> None:
    import json

    (tmp_path / "baseline.json").write_text(json.dumps(BASELINE))
    (tmp_path / "rules.yaml").write_text("rules: []\n")
    path = tmp_path / "specguard.yaml"
    path.write_text("server: {port: 0}\nstate_dir: state\nrules: [rules.yaml]\nbaseline: baseline.json\n")
    daemon = Daemon(load(path), path)
    try:
        m = daemon.metrics
        assert value(m, "specguard_baseline", model_name="llama", instance="", signal="ttft_p95") == 0.2
        measured = {"version": 1, "measured_at": "2026-12-02T00:00:00Z", "signals": {"ttft_p95": 0.3}}
        (tmp_path / "baseline.json").write_text(json.dumps(measured))
        assert await daemon.reload() is True
        assert value(m, "specguard_baseline", model_name="", instance="", signal="ttft_p95") == 0.3
        assert value(m, "specguard_baseline", model_name="llama", instance="", signal="ttft_p95") is None
    finally:
        await daemon.store.close()


async def test_every_actions_run_counters_are_exported_from_0_before_its_first_run(store: Store) -> None:
    d = Dispatcher(store, {"fallback": fallback(store.path.parent)}, False, DaemonMetrics())
    for status in ("ok", "failed", "skipped", "retry"):
        assert value(d.metrics, "specguard_action_runs_total", action="fallback", status=status) == 0


def test_each_rules_event_counters_start_at_zero() -> None:
    from prometheus_client import generate_latest

    from specguard.metrics.registry import DaemonMetrics

    metrics = DaemonMetrics()
    metrics.show_rules(["acceptance_fallback"])
    page = generate_latest(metrics.registry).decode()
    for state in ("pending", "firing", "resolved", "inactive"):
        assert f'specguard_events_total{{kind="{state}",rule="acceptance_fallback"}} 0.0' in page
