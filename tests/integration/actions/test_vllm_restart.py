"""The vllm_restart action against the simulator, restarted the way systemd restarts vLLM
(tests/supervisor.py: the command line expanded from the environment file): ladder steps down and
up, both config styles, rollback when the new config does not come up, and a change cut short by a
stop, completed by the next daemon. The real vLLM runs the same in tests/e2e."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specguard.actions.base import ActionContext, ActionMemory
from specguard.actions.vllm_restart import VllmRestartParams, speculative
from specguard.actions.vllm_restart.change import STATE_KEY
from specguard.actions.vllm_restart.server import Server
from specguard.sim.traffic import Traffic
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from tests.ports import free_port
from tests.processes import Daemon, specguard
from tests.vllm_host import DRAFT, Host


@pytest.fixture(params=["env", "yaml"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    served = Host(tmp_path, request.param)
    served.start()
    yield served
    served.stop()


def ctx(store: Store, event_id: int) -> ActionContext:
    return ActionContext(
        rule="acceptance_critical", event="firing", severity="critical", labels={}, value=0.1, threshold=0.3,
        summary="acceptance low", event_id=event_id, memory=StoreMemory(store, "shrink"),
    )  # fmt: skip


async def test_each_firing_steps_one_rung_down_and_a_step_up_puts_the_other_keys_back(
    host: Host, store: Store
) -> None:
    action = host.action()
    memory = StoreMemory(store, "shrink")
    await Server(host.url, None).wait_healthy(30)

    first = await action.run(ctx(store, 1))
    assert first.ok, first.detail
    assert "k 4 -> 2" in first.detail and "/metrics counts draft positions 0-1" in first.detail
    config = (
        speculative.read_env(host.path.read_text(), "f")
        if host.style == "env"
        else speculative.read_yaml(host.path.read_text(), "f")
    )
    assert config == {**DRAFT, "num_speculative_tokens": 2}
    assert host.path.with_name(host.path.name + ".prev").exists()  # the version before, kept

    again = await action.run(ctx(store, 1))  # the same firing's run, repeated (after a crash)
    assert again == first and len(host.commands()) == 2  # nothing done twice

    off = await action.run(ctx(store, 2))
    assert off.ok and "k 2 -> 0" in off.detail and "off, as configured" in off.detail, off.detail
    if host.style == "env":
        assert host.commands()[-1]["env"] == {"VLLM_SPECULATIVE_CONFIG": ""}
    else:
        text = host.path.read_text()
        assert "speculative-config" not in text
        assert "# vLLM options for this host" in text and "model: tiny-llama   # served name" in text

    bottom = await action.run(ctx(store, 3))
    assert bottom.ok and "k=0 is the ladder's bottom rung" in bottom.detail

    up = await action.step(memory, "up", "alice")
    assert up.ok and "k 0 -> 2" in up.detail, up.detail
    if host.style == "env":
        assert json.loads(host.commands()[-1]["env"]["VLLM_SPECULATIVE_CONFIG"]) == {
            **DRAFT,
            "num_speculative_tokens": 2,
        }
    shown = await action.show(memory)
    assert shown["k"] == 2 and shown["file_k"] == 2
    assert [(e["from"], e["to"], e["ok"]) for e in shown["log"]] == [(4, 2, True), (2, 0, True), (0, 2, True)]
    assert shown["log"][-1]["reason"] == "by hand (alice)"
    assert shown["log"][-1]["config_after"] == {**DRAFT, "num_speculative_tokens": 2}
    refused = await action.step(memory, 3, "alice")
    assert not refused.ok and "k=3 is not a rung of the ladder [4, 2, 0]" in refused.detail


async def test_a_config_that_does_not_come_up_is_rolled_back_to_the_last_one_seen_running(
    host: Host, store: Store
) -> None:
    action = host.action(health_timeout="6s", ladder=[4, 2, 1, 0])
    await Server(host.url, None).wait_healthy(30)
    assert (await action.run(ctx(store, 1))).ok  # k 4 -> 2: now known to run
    # Someone edits the file: the draft is gone from the config, which the server refuses to start
    # with (it runs on with the config it read at start).
    broken = {"num_speculative_tokens": 2, "prompt_lookup_max": 3}
    text = host.path.read_text()
    host.path.write_text(
        speculative.render_env(broken, "edited")
        if host.style == "env"
        else speculative.render_yaml(text, broken, "0.32.0", "f")
    )
    outcome = await action.run(ctx(store, 2))
    assert not outcome.ok
    # (no status_command: only /health and its timeout tell that the start failed)
    assert "k 2 -> 1 failed at verify: not healthy within 6s" in outcome.detail, outcome.detail
    assert "rolled back to k=2: /metrics counts draft positions 0-1" in outcome.detail
    # the file vLLM runs with is the one it ran before, not the edited one
    assert "prompt_lookup_max" not in host.path.read_text() and "tiny-draft" in host.path.read_text()
    state = await StoreMemory(store, "shrink").read(STATE_KEY)
    assert state["k"] == 2 and state["change"] is None
    assert state["log"][-1]["ok"] is False


async def test_a_server_that_exits_at_start_is_rolled_back_as_soon_as_the_status_command_says_so(
    host: Host, store: Store
) -> None:
    # health_timeout far beyond the test's own limit: only the watch can end the wait in time
    action = host.action(health_timeout="600s", ladder=[4, 2, 1, 0], status_command=host.status_command)
    await Server(host.url, None).wait_healthy(30)
    assert (await action.run(ctx(store, 1))).ok  # k 4 -> 2: now known to run
    host.break_config()
    async with asyncio.timeout(120):
        outcome = await action.run(ctx(store, 2))
    assert not outcome.ok
    assert re.search(
        r"^k 2 -> 1 failed at verify: the server is down \(status_command: exited with status 2 after \d+s\) "
        r"\d+s after the restart; rolled back to k=2: /metrics counts draft positions 0-1$",
        outcome.detail,
    ), outcome.detail
    assert "tiny-draft" in host.path.read_text() and "prompt_lookup_max" not in host.path.read_text()
    state = await StoreMemory(store, "shrink").read(STATE_KEY)
    assert state["k"] == 2 and state["change"] is None
    assert state["log"][-1]["ok"] is False and state["log"][-1]["detail"] == outcome.detail
    assert len(host.commands()) == 4  # the first start, the step, the broken step, its rollback


async def test_a_unit_that_fails_at_start_ends_the_wait_for_the_step_and_for_its_rollback(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host(tmp_path, "env")
    host.systemctl(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    host.start()
    try:
        await Server(host.url, None).wait_healthy(30)
        # The file is broken before the first step, so the rollback (to the file as it was, nothing
        # having been seen running) fails to start as well.
        host.break_config()
        action = host.action(command=None, unit="shrink.service", health_timeout="600s")
        assert action.restart_argv == ("systemctl", "--no-ask-password", "restart", "shrink.service")
        async with asyncio.timeout(120):
            outcome = await action.run(ctx(store, 1))
    finally:
        host.stop()
    assert not outcome.ok
    failed = r"shrink\.service failed \(Result=exit-code, status 2\) \d+s after the restart"
    assert re.search(
        rf"^k 4 -> 2 failed at verify: {failed}; rolling back failed too: {failed}: vLLM needs a hand$",
        outcome.detail,
    ), outcome.detail
    assert len(host.commands()) == 3  # the first start, the step, the rollback


async def test_a_change_cut_short_is_completed_by_the_next_daemon(host: Host, store: Store) -> None:
    memory = StoreMemory(store, "shrink")
    action = host.action()
    await Server(host.url, None).wait_healthy(30)
    task = asyncio.create_task(action.run(ctx(store, 7)))
    # stopped once the restart was issued, before the verification ended (the daemon killed)
    for _ in range(300):
        state = await memory.read(STATE_KEY)
        if state and state.get("change") and state["change"]["phase"] == "verify":
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await memory.read(STATE_KEY)
    assert state["change"]["phase"] == "verify" and state["change"]["to"] == 2
    shown = (await action.show(memory))["change"]
    assert shown["phase"] == "verify" and not {"before", "after", "rollback_text"} & set(
        shown
    )  # no file texts

    fresh = host.action()  # the next daemon's instance
    assert await fresh.tick(memory) is None
    state = await memory.read(STATE_KEY)
    assert state["change"] is None and state["k"] == 2
    assert "completed after specguard restarted" in state["log"][-1]["detail"]
    # the firing's run, carried out again by the next daemon, answers from the journal
    repeated = await fresh.run(ctx(store, 7))
    assert repeated.ok and "k 4 -> 2" in repeated.detail
    assert len(host.commands()) == 2  # the first start and the one restart


class Killed(BaseException):
    """The daemon's process ending between two of the store's transactions: nothing after runs."""


class KilledOnceTheJournalCloses:
    """The store's memory for an action whose process is killed as soon as the transaction that
    closes a change's journal has committed (the step made and verified, nothing after it run)."""

    def __init__(self, memory: ActionMemory) -> None:
        self.memory = memory
        self.closed = False

    async def read(self, key: str) -> Any:
        return await self.memory.read(key)

    async def update(
        self,
        key: str,
        change: Callable[[Any], Any],
        notes: Callable[[], Sequence[tuple[int, str]]] | None = None,
    ) -> Any:
        journal: list[Any] = []

        def watched(current: Any) -> Any:
            journal.append((current or {}).get("change"))
            return change(current)

        state = await self.memory.update(key, watched, notes)
        if key == STATE_KEY and journal[-1] is not None and state["change"] is None:
            self.closed = True
            raise Killed
        return state

    def of(self, action: str) -> ActionMemory:
        return self.memory.of(action)


@pytest.mark.parametrize("carried_out_by", ["the run", "the next daemon's tick"])
async def test_a_step_killed_once_its_journal_closes_is_not_taken_again_by_the_same_firing(
    host: Host, store: Store, carried_out_by: str
) -> None:
    memory = StoreMemory(store, "shrink")
    killing = KilledOnceTheJournalCloses(memory)
    await Server(host.url, None).wait_healthy(30)
    if carried_out_by == "the run":
        with pytest.raises(Killed):
            await host.action().run(replace(ctx(store, 7), memory=killing))
    else:  # the run stopped mid-verification; the next daemon completes the step, and is killed
        task = asyncio.create_task(host.action().run(ctx(store, 7)))
        for _ in range(300):
            state = await memory.read(STATE_KEY)
            if state and state.get("change") and state["change"]["phase"] == "verify":
                break
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(Killed):
            await host.action().tick(killing)
    assert killing.closed
    state = await memory.read(STATE_KEY)
    assert state["change"] is None and state["k"] == 2  # the step was made and verified
    (step,) = state["log"]

    # The dispatcher carries out the run left 'running' again, on the next daemon's instance.
    repeated = await host.action().run(ctx(store, 7))
    state = await memory.read(STATE_KEY)
    assert [(e["from"], e["to"]) for e in state["log"]] == [(4, 2)] and state["k"] == 2, state["log"]
    assert repeated.ok and repeated.detail == step["detail"]  # the first step's answer
    assert len(host.commands()) == 2  # the first start and the one restart


def test_bad_params_are_refused_with_the_reason(tmp_path: Path) -> None:
    base = {"type": "vllm_restart", "env_file": {"path": str(tmp_path / "s.env")}, "unit": "vllm.service"}
    for ladder, why in (
        ([3], "at least two rungs"),
        ([1, 3, 0], "from the most down"),
        ([3, -1], "from the most down"),
    ):
        with pytest.raises(ValidationError, match=why):
            VllmRestartParams.model_validate({**base, "ladder": ladder})
    with pytest.raises(ValidationError, match="run without a shell"):
        VllmRestartParams.model_validate(
            {**base, "ladder": [2, 0], "unit": None, "command": "systemctl restart vllm"}
        )
    with pytest.raises(ValidationError, match="`unit` \\(systemctl\\) or `command`, one"):
        VllmRestartParams.model_validate({**base, "ladder": [2, 0], "command": ["true"]})
    with pytest.raises(ValidationError, match="status_command goes with `command`; with `unit`, systemd"):
        VllmRestartParams.model_validate({**base, "ladder": [2, 0], "status_command": ["true"]})
    with pytest.raises(ValidationError, match="run without a shell"):
        VllmRestartParams.model_validate(
            {**base, "ladder": [2, 0], "unit": None, "command": ["true"], "status_command": "pidof vllm"}
        )
    with pytest.raises(ValidationError, match="`env_file` or `vllm_config`, one"):
        VllmRestartParams.model_validate(
            {**base, "ladder": [2, 0], "vllm_config": {"path": str(tmp_path / "v.yaml")}}
        )
    with pytest.raises(ValidationError, match=r"ends in \.yaml or \.yml"):
        VllmRestartParams.model_validate(
            {**base, "ladder": [2, 0], "env_file": None, "vllm_config": {"path": str(tmp_path / "v.json")}}
        )
    with pytest.raises(ValidationError) as caught:  # the step and its rollback must fit in the timeout
        VllmRestartParams.model_validate(
            {**base, "ladder": [2, 0], "timeout": "20m", "health_timeout": "10m"}
        )
    assert "timeout 20m cannot hold a step and its rollback, which may take 24m: twice command_timeout 2m plus " \
        "health_timeout 10m" in str(caught.value)  # fmt: skip
    params = VllmRestartParams.model_validate({**base, "ladder": [5, 3, 1, 0]})
    assert (params.cooldown, params.budget and (params.budget.runs, params.budget.per)) == (
        600.0,
        (2, 3600.0),
    )
    assert json.loads(json.dumps(params.ladder)) == [5, 3, 1, 0]


RULES = """\
rules:
  - name: acceptance_critical
    signal: acceptance_rate
    window: 3s
    interval: 1s
    condition: "< 0.3"
    severity: critical
    actions: [shrink]
"""


async def until(what: str, check: Any, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for: {what}")


async def test_a_firing_steps_down_through_the_daemon_and_ladder_steps_by_hand(tmp_path: Path) -> None:
    host = Host(tmp_path, "yaml", "--temperature-decay", "1.2")
    host.start()
    port = free_port()
    (tmp_path / "rules.yaml").write_text(RULES)
    action = {"type": "vllm_restart", "ladder": [4, 2, 1, 0], "url": host.url, "vllm_config": {"path": str(host.path)},
              "command": host.command, "health_timeout": "30s"}  # fmt: skip
    config = tmp_path / "specguard.yaml"
    config.write_text(json.dumps({
        "server": {"port": port}, "state_dir": "state", "interval": "1s", "rules": ["rules.yaml"],
        "sources": {"scrape": {"targets": [f"{host.url}/metrics"]}}, "actions": {"shrink": action},
    }))  # fmt: skip
    daemon = Daemon(config, port, tmp_path / "specguard.log")
    traffic = Traffic(host.url, "tiny-llama", concurrency=2, max_tokens=32, temperature=1.5)
    try:
        await Server(host.url, None).wait_healthy(30)
        daemon.start()
        await traffic.start()  # acceptance falls: the rule fires and the action steps down

        async def stepped() -> bool:
            code, out, _ = await specguard("ladder", "show", "--config", str(config), "--format", "json")
            return code == 0 and json.loads(out)[0]["log"] != []

        await until("the firing's step", stepped)
        await traffic.stop()
        code, out, err = await specguard("ladder", "show", "--config", str(config))
        assert code == 0, err
        assert out.splitlines()[0] == f"shrink: k=2  ladder 4 [2] 1 0  ({host.path} says k=2)"
        assert re.search(r"k 4 -> 2  ok  acceptance_critical firing: k 4 -> 2: restarted in", out), out
        code, out, _ = await specguard("history", "--config", str(config), "--format", "json")
        # (the verification's requests, at temperature 0, may resolve the rule for a moment and the
        # hot traffic fire it again: the cooldown holds that firing back, without a note)
        (firing,) = [e for e in json.loads(out) if e["kind"] == "firing" and e["notes"]]
        (note,) = firing["notes"]
        assert note["action"] == "shrink" and note["text"].startswith("k 4 -> 2 (ok, "), note
        assert (
            '"num_speculative_tokens":4} -> {' in note["text"]
            and '"num_speculative_tokens":2}' in note["text"]
        )

        code, out, err = await specguard("ladder", "up", "--config", str(config), timeout=120)
        assert (code, out.strip().split(": ", 1)[0]) == (0, "ok"), (out, err)
        assert "k 2 -> 4" in out and "/metrics counts draft positions 0-3" in out
        code, out, err = await specguard("ladder", "set", "3", "--config", str(config))
        assert code == 1 and "k=3 is not a rung of the ladder [4, 2, 1, 0]" in out + err
        code, out, err = await specguard("ladder", "down", "--config", str(config), "--action", "nope")
        assert code == 1 and "no vllm_restart action 'nope'" in err and "(there: shrink)" in err
    finally:
        await traffic.stop()
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        host.stop()
    code, out, err = await specguard("ladder", "down", "--config", str(config))
    assert code == 1 and "does not answer" in err and "steps are made by the running daemon" in err
    code, out, err = await specguard("ladder", "show")
    assert code == 1 and "the built-in defaults has no vllm_restart action" in err


async def test_a_drain_holds_the_flag_through_the_restart_and_lets_go_once_verified(
    tmp_path: Path, store: Store
) -> None:
    """The flag is engaged while vLLM restarts; once the step is verified its journal closes and the
    fallback controller restores the flag, trying again when the write fails (the flag's reload
    refuses at first) until it is done."""
    from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
    from specguard.dispatch import Dispatcher
    from specguard.metrics.registry import DaemonMetrics

    host = Host(tmp_path, "env")
    host.start()
    flag_file, seen, ready = tmp_path / "flag.json", tmp_path / "flag-at-restart", tmp_path / "router-ready"
    # the router's reload takes the engaged flag, and refuses the restored one until it is ready
    reload = [
        "/bin/sh",
        "-c",
        f"grep -q false {shlex.quote(str(flag_file))} || test -e {shlex.quote(str(ready))}",
    ]
    flag = FeatureFlagAction("fallback", FeatureFlagParams.model_validate(
        {"type": "feature_flag", "file": {"path": str(flag_file), "engage": {"speculative": False},
                                          "restore": {"speculative": True}, "reload": reload}}))  # fmt: skip
    # the restart command notes what the router reads at that moment, then restarts
    noting = ["/bin/sh", "-c", f'cat {shlex.quote(str(flag_file))} >> {shlex.quote(str(seen))}; exec "$@"', "sh",
              *host.command]  # fmt: skip
    action = host.action(command=noting, drain="fallback")
    action.connect({"fallback": flag, "shrink": action})
    now = [time.time()]
    d = Dispatcher(store, {"fallback": flag}, False, DaemonMetrics(), clock=lambda: now[0])
    try:
        await Server(host.url, None).wait_healthy(30)
        outcome = await action.run(ctx(store, 1))
    finally:
        host.stop()
    assert outcome.ok, outcome.detail
    assert json.loads(seen.read_text()) == {"speculative": False}  # drained while vLLM restarted
    assert "; drain fallback: let go (restored unless a rule still holds it)" in outcome.detail, (
        outcome.detail
    )
    assert await action.draining(StoreMemory(store, "shrink")) is None  # the journal is closed

    await d.step()  # the controller: nothing holds the flag, no rule held it: restored, no canary
    assert json.loads(flag_file.read_text()) == {"speculative": True}
    record = await StoreMemory(store, "fallback").read("flag")
    assert record["state"] == "unknown" and record["failures"] == 1  # the reload refused: tried again
    now[0] += 5
    await d.step()
    assert (await StoreMemory(store, "fallback").read("flag"))["failures"] == 1  # not before its backoff
    ready.touch()
    now[0] += 6
    await d.step()
    record = await StoreMemory(store, "fallback").read("flag")
    assert (record["state"], record["engaged"], record["holders"]) == ("restored", False, {})

    with pytest.raises(ValueError, match="drain: 'oncall' is not a feature_flag action of this config"):
        host.action(drain="oncall").connect({"oncall": action})


def test_a_drain_that_names_no_feature_flag_is_a_config_problem_with_its_line(tmp_path: Path) -> None:
    from specguard.config.loading import load

    config = tmp_path / "specguard.yaml"
    config.write_text(
        "actions:\n"
        "  shrink:\n"
        "    type: vllm_restart\n"
        "    ladder: [3, 0]\n"
        "    env_file: {path: s.env}\n"
        "    unit: vllm.service\n"
        "    drain: fallback\n"
    )
    loaded = load(config)
    assert not loaded.ok
    assert [str(p) for p in loaded.errors] == [
        f"{config}:2: actions.shrink: drain: 'fallback' is not a feature_flag action of this config"
    ]


async def test_step_up_after_a_healthy_period_only_when_asked_for(tmp_path: Path, store: Store) -> None:
    host = Host(tmp_path, "env")
    host.start()
    try:
        await Server(host.url, None).wait_healthy(30)
        manual = host.action()
        assert not manual.restores  # a resolution plans nothing: stepping up is by hand
        assert (await manual.run(ctx(store, 1))).ok
        kept = await manual.restore(ctx(store, 2))
        assert kept.ok and kept.detail == "stepping up is by hand: specguard ladder up"

        timed = host.action(step_up_after="30m")
        assert timed.restores and timed.restore_delay == 1800.0
        resolved = ActionContext(**{**ctx(store, 3).__dict__, "event": "resolved"})
        up = await timed.restore(resolved)
        assert up.ok and "k 2 -> 4" in up.detail and "draft positions 0-3" in up.detail, up.detail
        again = await timed.restore(resolved)  # the same resolution's restore, repeated: nothing more
        assert again == up
    finally:
        host.stop()


@pytest.mark.parametrize(
    ("acceptance", "ok", "said"), [("0.9", True, "recovered"), ("0.2", False, "still collapsed")]
)
async def test_after_a_step_a_sequential_test_says_whether_acceptance_recovered(
    tmp_path: Path, store: Store, acceptance: str, ok: bool, said: str
) -> None:
    host = Host(tmp_path, "env", "--acceptance-by-position", acceptance)
    host.start()
    try:
        sprt = {"in_control": 0.85, "shift_to": 0.4, "false_recovery": 0.01, "false_collapse": 0.05}
        action = host.action(verify_acceptance=sprt, verify_requests=2, verify_max_tokens=32)
        await Server(host.url, None).wait_healthy(30)
        outcome = await action.run(ctx(store, 1))
    finally:
        host.stop()
    assert outcome.ok is ok, outcome.detail
    assert "k 4 -> 2" in outcome.detail and f"acceptance: {said} (acceptance " in outcome.detail
    assert "evidence" in outcome.detail and "against bounds -4.55 / +2.99" in outcome.detail
    # Still collapsed is not a failed restart: vLLM runs k = 2 as configured, nothing rolled back.
    assert speculative.read_env(host.path.read_text(), "f") == {**DRAFT, "num_speculative_tokens": 2}
    assert "rolled back" not in outcome.detail
