"""Item 7, the fallback drill, against the demo's stack: two simulated vLLMs (one speculative, one
standard) behind specguard's real nginx router, the ``feature_flag`` action's ``nginx`` backend,
a canary on the speculative server, the state database; beside a running daemon for the last ones.

Each drill that fails is made to fail on purpose (a flag API that does not answer, a flag the
router does not read, a canary that sees acceptance low, the drill cancelled or killed), and
ends with the flag restored and the drill recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specguard.actions.feature_flag.canary import Canary, CanaryResult
from specguard.cli.entry import main
from specguard.daemon.runtime import Daemon
from specguard.preflight.item import Status
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from tests.drill_stack import DrillStack, drill_stack
from tests.nginx_router import require_nginx
from tests.ports import free_port
from tests.readings import Readings
from tests.statedb import flag_memory, runs, until

HEALTHY, COLLAPSED = 0.85, 0.05
DAY = 86400.0


@pytest.fixture(autouse=True)
def _nginx() -> None:
    require_nginx()


@contextlib.asynccontextmanager
async def stack(directory: Path) -> AsyncIterator[tuple[DrillStack, Simulator, Simulator]]:
    speculative = await start_simulator(
        SimOptions(
            port=free_port(), step_time=0.002, seed=3,
            speculative=SpeculativeConfig("draft_model", "tiny-draft", 4), acceptance_by_position=[HEALTHY],
        )
    )  # fmt: skip
    try:
        standard = await start_simulator(SimOptions(port=free_port(), step_time=0.002, seed=4))
        try:
            async with drill_stack(
                directory, f"127.0.0.1:{speculative.options.port}", f"127.0.0.1:{standard.options.port}"
            ) as world:
                yield world, speculative, standard
        finally:
            await standard.stop()
    finally:
        await speculative.stop()


def outcome(world: DrillStack) -> tuple[str, str]:
    last = world.drills()[-1]
    return last["outcome"], last["detail"]


async def restored(world: DrillStack) -> bool:
    """The router follows the speculative pool again, and nginx would read the same at a restart."""
    return not await world.engaged() and world.flag_file_says() in (None, {"fallback": False})


# --- the drill, and what is on record after it --------------------------------------------------


async def test_a_drill_engages_the_flag_sees_traffic_move_restores_it_and_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with stack(tmp_path) as (world, _, standard):
        world.write()
        before = len(standard.ground_truth())
        answer = await world.check()
        assert answer.status is Status.PASS, answer
        said = "\n".join(answer.evidence)
        assert "before: 3 probe(s) through" in said and "answered 200 by pool speculative" in said
        assert "engaged: 3 probe(s) answered 200 by pool standard (X-Specguard-Pool)" in said
        assert "the router counted +3 request(s) to standard" in said
        assert "the canary would restore: canary: acceptance" in said
        assert "restored: 3 probe(s) answered 200 by pool speculative" in said
        assert len(standard.ground_truth()) >= before + 3  # the standard server served the probes
        assert await restored(world)
        (row,) = world.drills()
        assert row["outcome"] == "passed" and row["finished"] >= row["started"]
        assert row["evidence"] == list(answer.evidence[1:])
        # the daemon's own record of the flag was never touched: the drill kept its own
        assert world.memory("flag") == {}
        assert world.memory("drill")["state"] == "restored"

        # without --drill: the last drill, and its age against max_age
        answer = await world.check(drill=False)
        assert answer.status is Status.PASS, answer
        assert answer.evidence[0].startswith("the last drill (#1, ") and "passed" in answer.evidence[0]
        late = await world.check(drill=False, now=time.time() + 31 * DAY)
        assert late.status is Status.FAIL and "older than preflight.drill.max_age 4w2d" in late.evidence[0]
        assert late.fix is not None and late.fix.startswith(
            "specguard preflight --drill --only drill --config "
        )

        # specguard history --drills
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["history", "--config", str(world.config), "--drills"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].split() == ["STARTED", "(UTC)", "DRILL", "ACTION", "OUTCOME", "TOOK", "DETAIL"]
        assert out[1].split()[2:5] == ["#1", "fallback", "passed"]
        assert "engaged, traffic moved, restored through the canary" in out[1]
        assert any("answered 200 by pool standard" in line for line in out[2:])


async def test_without_a_drill_on_record_the_item_fails_and_names_the_command(tmp_path: Path) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        answer = await world.check(drill=False)
        assert answer.status is Status.FAIL
        assert answer.evidence[0] == "no drill on record: there is no state database yet"
        assert answer.fix == f"specguard preflight --drill --only drill --config {world.config}"


async def test_a_fallback_without_a_canary_or_a_rule_is_not_built(tmp_path: Path) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write(with_canary=False, rule_actions="[log]")
        answer = await world.check()
        assert answer.status is Status.FAIL, answer
        assert answer.evidence[0] == "passed: engaged, traffic moved, restored (no canary configured)"
        assert (
            "no enabled rule names fallback in its actions: nothing would engage the fallback"
            in answer.evidence
        )
        assert any(line.startswith("actions.fallback has no canary") for line in answer.evidence)
        assert await restored(world)


async def test_two_drills_at_once_one_runs_the_other_is_refused(tmp_path: Path) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        answers = await asyncio.gather(world.check(), world.check())
        assert sorted(a.status for a in answers) == [Status.FAIL, Status.PASS], answers
        rows = world.drills()
        assert sorted(row["outcome"] for row in rows) == ["passed", "refused"]
        (refused,) = [row for row in rows if row["outcome"] == "refused"]
        assert "one drill at a time" in refused["detail"], refused["detail"]
        assert await restored(world)


# --- broken on purpose: each drill fails, the flag ends restored, the drill is recorded ------------


async def test_a_flag_api_that_does_not_answer_fails_the_drill_and_nothing_stays_engaged(
    tmp_path: Path,
) -> None:
    async with stack(tmp_path) as (world, _, _):
        dead = f"http://127.0.0.1:{free_port()}/flags/speculative"
        http = {"url": dead, "engage": {"enabled": False}, "restore": {"enabled": True},
                "retries": 0, "request_timeout": "1s"}  # fmt: skip
        world.write(backend={"http": http})
        answer = await world.check()
        assert answer.status is Status.FAIL
        result, detail = outcome(world)
        assert result == "failed" and detail.startswith("engage failed: engage: PUT " + dead), detail
        assert "THE FLAG MAY STILL BE ENGAGED" in detail  # its restore could not be sent either: said so
        assert await restored(world)  # the router's flag was never changed
        # the next look says the drill may have left it engaged, and how to clear it
        left = await world.check(drill=False)
        assert left.status is Status.FAIL and "may still be engaged" in left.evidence[0]


async def test_a_router_that_does_not_move_traffic_fails_the_drill_and_the_flag_is_restored(
    tmp_path: Path,
) -> None:
    async with stack(tmp_path) as (world, _, _):
        unread = tmp_path / "nobody-reads-this.json"  # a flag file the router does not read
        file = {"path": str(unread), "engage": {"fallback": True}, "restore": {"fallback": False}}
        world.write(backend={"file": file}, drill={"timeout": "2s"})
        began = time.monotonic()
        answer = await world.check()
        assert answer.status is Status.FAIL
        result, detail = outcome(world)
        assert result == "failed", detail
        assert detail.startswith(
            "traffic did not move: 2s after the engage the probes were answered 3x 200 from speculative"
        )
        assert time.monotonic() - began < 30
        assert world.flag_file_says() is None or not await world.engaged()
        assert json.loads(unread.read_text()) == {"fallback": False}  # restored on the way out
        assert world.memory("drill")["state"] == "restored"
        assert any(
            line.startswith("restored on the way out: speculative decoding restored")
            for line in world.drills()[-1]["evidence"]
        )


async def test_a_canary_that_sees_acceptance_low_fails_the_drill_and_the_drill_restores_the_flag(
    tmp_path: Path,
) -> None:
    async with stack(tmp_path) as (world, speculative, _):
        world.write()
        speculative.engine.set_acceptance(COLLAPSED)
        answer = await world.check()
        assert answer.status is Status.FAIL
        result, detail = outcome(world)
        assert result == "failed"
        assert detail.startswith("the canary would keep the fallback: canary: acceptance 0.0"), detail
        assert detail.endswith("below 0.5")
        assert await restored(world)  # the drill engaged it: the drill takes it off
        assert world.memory("drill")["state"] == "restored"


async def test_a_flag_engaged_by_hand_is_refused_and_left_engaged(tmp_path: Path) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        await world.admin("PUT", {"fallback": True})
        answer = await world.check()
        assert answer.status is Status.FAIL
        assert outcome(world) == (
            "refused",
            "the flag reads unknown (the router and its flag file disagree: set by hand?): not the drill's to change",
        )
        assert await world.engaged()  # not the drill's to undo
        assert world.memory("drill") == {}


async def test_a_drill_cancelled_restores_the_flag_and_is_recorded_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        probing = asyncio.Event()

        async def stalls(self: Canary) -> CanaryResult:
            probing.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        monkeypatch.setattr(Canary, "probe", stalls)
        for stop in ("cancel", "sigterm"):
            task = asyncio.create_task(world.check())
            await asyncio.wait_for(probing.wait(), 30)
            assert await world.engaged()
            if stop == "cancel":
                task.cancel()
            else:
                os.kill(os.getpid(), signal.SIGTERM)  # the drill turns it into a cancellation
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await restored(world), stop
            result, detail = outcome(world)
            assert (result, detail) == ("interrupted", "cut short (interrupted or timed out)"), stop
            assert world.drills()[-1]["evidence"][-1].startswith("restored on the way out: ")
            probing.clear()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the drill's handler is gone


DRILL_IN_A_PROCESS = """
import asyncio, sys
from pathlib import Path
from specguard.config.loading import load
from specguard.preflight.item import Context
from specguard.preflight.items import drill
loaded = load(Path(sys.argv[1]))
assert loaded.ok, loaded.problems
print(asyncio.run(drill.check(Context(loaded, Path(sys.argv[1]), None, 0.0, drill=True))))
"""


async def test_a_drill_killed_outright_is_restored_by_the_next_one(tmp_path: Path) -> None:
    """SIGKILL leaves no way out: the drill's record in the action's memory says it engaged the
    flag; the item says so, and the next drill restores it first."""
    asked = asyncio.Event()

    def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked.set()  # and never answered

    hangs = await asyncio.start_server(connected, "127.0.0.1", free_port())  # a canary that never answers
    port = hangs.sockets[0].getsockname()[1]
    try:
        async with stack(tmp_path) as (world, _, _):
            world.write(canary={"url": f"http://127.0.0.1:{port}", "min_acceptance": 0.5, "timeout": "1m"})
            env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
            process = subprocess.Popen([sys.executable, "-c", DRILL_IN_A_PROCESS, str(world.config)], env=env)
            try:
                await asyncio.wait_for(asked.wait(), 60)  # engaged, traffic seen moving, the canary asked
                assert world.memory("drill")["state"] == "engaged"
                process.kill()
                process.wait(10)
            finally:
                if process.poll() is None:
                    process.kill()
            assert await world.engaged()
            assert world.drills()[-1]["outcome"] == "running"
            answer = await world.check(drill=False)
            assert answer.status is Status.FAIL
            assert answer.evidence[0].startswith(
                "drill #1 did not restore the flag (its record says engaged)"
            )
            assert answer.fix is not None and answer.fix.endswith("(restores it first)")

            world.write()  # a canary that answers
            answer = await world.check()
            assert answer.status is Status.PASS, answer
            assert any(
                line.startswith(
                    "drill #1 left the flag engaged (cut short, or its restore failed): restored first"
                )
                for line in answer.evidence
            )
            assert [row["outcome"] for row in world.drills()] == ["interrupted", "passed"]
            assert await restored(world)
    finally:
        hangs.close()


# --- beside a running daemon ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def daemon(world: DrillStack, acceptance: float) -> AsyncIterator[tuple[Daemon, Readings]]:
    """The daemon in the test's process on the same config, its rule driven by a number."""
    running = Daemon(world.loaded(), world.config)
    source = Readings(acceptance)
    running.source = source
    await running.start(handle_signals=False)
    try:
        yield running, source
    finally:
        await running.shutdown()


async def test_a_drill_is_refused_while_a_rule_holds_the_flag(tmp_path: Path) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        async with daemon(world, 0.2):
            await until("the daemon's engage", lambda: flag_memory(world.db).get("state") == "engaged")
            await until(
                "its run recorded", lambda: [r["status"] for r in runs(world.db, "fallback")] == ["ok"]
            )
            ran = runs(world.db, "fallback")
            answer = await world.check()
            assert answer.status is Status.FAIL
            result, detail = outcome(world)
            assert result == "refused"
            assert detail.startswith(
                "the flag is held: specguard's fallback controller has the flag engaged for "
            )
            assert 'a rule that names fallback fires: acceptance_low{instance="vllm-a:8000"}' in detail
            assert await world.engaged() and flag_memory(world.db)["state"] == "engaged"  # left as it was
            assert runs(world.db, "fallback") == ran


async def test_the_daemon_leaves_a_drill_alone_and_the_drill_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        async with daemon(world, 0.8) as (running, _):
            paused, go = asyncio.Event(), asyncio.Event()
            probe = Canary.probe

            async def waits(self: Canary) -> CanaryResult:
                paused.set()
                await go.wait()
                return await probe(self)

            monkeypatch.setattr(Canary, "probe", waits)
            task = asyncio.create_task(world.check())
            await asyncio.wait_for(paused.wait(), 30)
            # the flag engaged by the drill: the daemon reads it engaged, and leaves it alone
            await until(
                "the daemon reads the flag engaged", lambda: flag_memory(world.db).get("seen") == "engaged"
            )
            await asyncio.sleep(1.0)  # ten ticks more
            assert await world.engaged()
            assert flag_memory(world.db).get("state", "restored") == "restored"
            assert runs(world.db, "fallback") == []
            assert running.status()["fallbacks"]["fallback"]["should_be"] == "alone"
            go.set()
            answer = await task
            assert answer.status is Status.PASS, answer
            await asyncio.sleep(0.5)
            assert await restored(world) and runs(world.db, "fallback") == []


async def test_a_rule_that_fires_during_a_drill_takes_the_flag_over_and_the_drill_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path) as (world, _, _):
        world.write()
        async with daemon(world, 0.8) as (_, source):
            paused, go = asyncio.Event(), asyncio.Event()
            probe = Canary.probe

            async def waits(self: Canary) -> CanaryResult:
                if not paused.is_set():
                    paused.set()
                    await go.wait()
                return await probe(self)

            monkeypatch.setattr(Canary, "probe", waits)
            task = asyncio.create_task(world.check())
            await asyncio.wait_for(paused.wait(), 30)
            source.value = 0.2  # acceptance collapses during the drill: the rule fires
            await until("the daemon's engage", lambda: flag_memory(world.db).get("state") == "engaged")
            go.set()
            answer = await task
            assert answer.status is Status.FAIL
            result, detail = outcome(world)
            assert result == "handed_over"
            assert detail.startswith(
                "the daemon took the flag over during the drill: specguard's fallback controller"
            )
            assert await world.engaged()  # the rule holds it: not the drill's to restore
            assert world.memory("drill")["state"] == "restored"  # the drill no longer claims it

            source.value = 0.8  # the rule resolves: the daemon restores it, through its canary
            await until(
                "the daemon's restore", lambda: flag_memory(world.db).get("state") == "restored", seconds=60
            )
            assert await restored(world)
