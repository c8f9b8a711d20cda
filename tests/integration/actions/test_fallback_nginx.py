"""The fallback through specguard's own router: a real nginx running the rendered router in front of
two simulated vLLMs (one with speculative decoding, one without), the feature_flag action's
``nginx`` backend setting the flag through the router's admin location and its flag file.

- `specguard run` in its own process scrapes the speculative server; its acceptance collapses, the
  rule fires, the flag is engaged, and every request sent once the engage is confirmed goes to the
  standard pool; acceptance back and the quiet period over, the flag is restored and the requests
  go back.
- With the daemon in the test's process (its rule driven by a number): a reload keeps the fallback
  and lets a stream in flight finish; nginx stopped and started again reads the flag file; a flag
  restored by hand through the admin location while the rule fires is put right.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.actions.feature_flag.nginx import NginxBackend
from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from tests.nginx_router import Router, require_nginx, routing_config
from tests.ports import free_port
from tests.processes import Daemon as DaemonProcess
from tests.readings import Readings
from tests.statedb import flag_memory, runs, until

RULE = "acceptance_low"
MODEL = "tiny-llama"
HEALTHY, COLLAPSED = 0.85, 0.05  # the speculative server's acceptance per draft position


@pytest.fixture(autouse=True)
def _nginx() -> None:
    require_nginx()


@dataclass
class Sent:
    at: float  # time.time() before the request left
    pool: str  # the router's X-Specguard-Pool, or "error: ..."


@dataclass
class Stack:
    """The two simulated servers and nginx between them."""

    directory: Path
    speculative: Simulator
    standard: Simulator
    router: Router
    routing: dict[str, Any]  # the router's `routing:` section, as a config gives it
    sent: list[Sent] = field(default_factory=list)

    @property
    def flag(self) -> Path:
        return self.directory / "routing-flag.json"

    def nginx(self, **extra: Any) -> str:
        """The action's ``nginx:`` block, as YAML flow."""
        given = {"admin_url": self.router.admin_url, "flag_file": str(self.flag), "backoff": "100ms", **extra}
        return json.dumps(given)

    async def admin(self, method: str = "GET", body: Any = None) -> dict[str, Any]:
        url = f"{self.router.admin_url}/specguard/flag"
        async with aiohttp.ClientSession() as session, session.request(method, url, json=body) as answer:
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())

    async def complete(self, session: aiohttp.ClientSession) -> str:
        """One request of the traffic (no class matches it: the default pool); the pool it went to."""
        body = {"model": MODEL, "prompt": "tell me a story", "max_tokens": 64, "temperature": 0}
        async with session.post(f"{self.router.url}/v1/completions", json=body) as answer:
            await answer.read()
            if answer.status != 200:
                return f"error: {answer.status}"
            return answer.headers["X-Specguard-Pool"]

    async def load(self, workers: int = 3) -> None:
        """Requests through the router until cancelled, each noted with when it left and its pool."""

        async def worker() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                while True:
                    at = time.time()
                    try:
                        pool = await self.complete(session)
                    except aiohttp.ClientError as exc:
                        pool = f"error: {exc}"
                        await asyncio.sleep(0.05)
                    self.sent.append(Sent(at, pool))

        await asyncio.gather(*(worker() for _ in range(workers)))

    def answered_after(self, moment: float) -> list[str]:
        return [s.pool for s in self.sent if s.at >= moment]


@contextlib.asynccontextmanager
async def stack(directory: Path) -> AsyncIterator[Stack]:
    speculative = await start_simulator(
        SimOptions(
            port=free_port(),
            step_time=0.004,
            seed=3,
            speculative=SpeculativeConfig("draft_model", "tiny-draft", 4),
            acceptance_by_position=[HEALTHY],
        )
    )
    try:
        # standard decoding, one token a step: 10 ms a token keeps a long stream in flight for seconds
        standard = await start_simulator(SimOptions(port=free_port(), step_time=0.01, seed=4))
        try:
            flag = directory / "routing-flag.json"
            routing = routing_config(
                f"127.0.0.1:{speculative.options.port}", f"127.0.0.1:{standard.options.port}", flag
            )
            router = Router(directory / "nginx", routing)
            await asyncio.to_thread(router.start)
            try:
                yield Stack(directory, speculative, standard, router, routing)
            finally:
                await asyncio.to_thread(router.stop)
        finally:
            await standard.stop()
    finally:
        await speculative.stop()


def fallback_runs(db: Path) -> list[tuple[str, str, str]]:
    """(mode, event kind, status) of the fallback's runs, oldest first."""
    return [(run["mode"], run["kind"], run["status"]) for run in runs(db, "fallback")]


# --- 1. `specguard run`: a collapse engages the fallback through nginx; the restore undoes it -----


async def test_a_collapse_sends_every_new_request_to_the_standard_pool_and_the_restore_brings_them_back(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    async with stack(tmp_path) as world:
        port = free_port()
        (tmp_path / "rules.yaml").write_text(
            f"rules:\n  - name: {RULE}\n    signal: acceptance_rate\n    window: 3s\n    interval: 1s\n"
            '    condition: "< 0.5"\n    no_data: ok\n    severity: critical\n    actions: [fallback]\n'
        )
        config = tmp_path / "specguard.yaml"
        config.write_text(
            f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\nrules: [rules.yaml]\n"
            f"sources: {{scrape: {{targets: [{world.speculative.url}/metrics]}}}}\n"
            f"routing: {json.dumps(world.routing)}\n"
            f"actions:\n  fallback:\n    type: feature_flag\n    quiet_period: 2s\n    nginx: {world.nginx()}\n"
        )
        db = tmp_path / "state" / "specguard.db"
        daemon = DaemonProcess(config, port, tmp_path / "specguard.log")
        traffic = asyncio.create_task(world.load())
        daemon.start()
        try:
            await daemon.wait_for(
                lambda s: any(r["rule"] == RULE and r["verdict"] == "ok" for r in s["rules"]), timeout=60
            )
            assert (await world.admin())["fallback"] is False
            assert set(world.answered_after(time.time() - 1)) == {"speculative"}

            world.speculative.engine.set_acceptance(COLLAPSED)
            await until(
                "the engage is confirmed",
                lambda: flag_memory(db).get("state") == "engaged",
                shown=lambda: (flag_memory(db), daemon.log.read_text()[-2000:]),
            )
            confirmed = float(flag_memory(db)["since"])  # the daemon's clock once the PUT was acknowledged
            assert json.loads(world.flag.read_text()) == {"fallback": True}  # written before the PUT
            assert (await world.admin())["fallback"] is True
            served = len(world.standard.ground_truth())
            await until(
                "requests sent since the engage are answered",
                lambda: len(world.answered_after(confirmed)) >= 9,
            )
            after = world.answered_after(confirmed)
            assert set(after) == {"standard"}, f"sent after the engage was confirmed: {after}"
            await until(
                "the standard server serves them", lambda: len(world.standard.ground_truth()) >= served + 6
            )

            world.speculative.engine.set_acceptance(HEALTHY)  # the draft is fine again
            await until(
                "the restore is confirmed",
                lambda: flag_memory(db).get("state") == "restored",
                seconds=90,
                shown=lambda: (flag_memory(db), daemon.log.read_text()[-2000:]),
            )
            (span,) = flag_memory(db)["spans"]
            restored = float(span["restored"])
            await until(
                "requests sent since the restore are answered",
                lambda: len(world.answered_after(restored)) >= 9,
            )
            after = world.answered_after(restored)
            assert set(after) == {"speculative"}, f"sent after the restore was confirmed: {after}"
            assert json.loads(world.flag.read_text()) == {"fallback": False}
            assert (await world.admin())["fallback"] is False
            assert [(mode, status) for mode, _, status in fallback_runs(db)] == [
                ("run", "ok"),
                ("restore", "ok"),
            ]
            errors = [s for s in world.sent if s.pool.startswith("error")]
            assert errors == [], errors
        finally:
            traffic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await traffic
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
    print(f"test took {time.monotonic() - began:.1f} s")


# --- 2. the daemon in the test's process, its rule driven by a number ---------------------------


async def daemon_for(world: Stack, hang_put: asyncio.Event | None = None) -> tuple[Daemon, Readings]:
    """A daemon in the test's process whose rule fires (its source reads acceptance 0.2), its
    fallback through the router. ``hang_put``: its PUTs to the admin location never end (set when
    one starts), as if specguard died between writing the flag file and telling the router."""
    directory = world.directory
    (directory / "rules.yaml").write_text(
        f'rules:\n  - name: {RULE}\n    signal: acceptance_rate\n    condition: "< 0.4"\n    window: 10s\n'
        "    severity: critical\n    actions: [fallback]\n"
    )
    config = directory / "specguard.yaml"
    config.write_text(
        "server: {port: 0}\nstate_dir: state\ninterval: 100ms\nrules: [rules.yaml]\n"
        f"routing: {json.dumps(world.routing)}\n"
        f"actions:\n  fallback:\n    type: feature_flag\n    quiet_period: 1s\n    nginx: {world.nginx()}\n"
    )
    loaded = load(config)
    assert loaded.problems == [], loaded.problems  # the action names the routing section's router
    if hang_put is not None:
        backend = loaded.actions["fallback"].backend  # type: ignore[attr-defined]
        assert isinstance(backend, NginxBackend)
        started = hang_put

        async def never(engage: bool, what: str) -> str:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        backend._put = never  # type: ignore[method-assign]
    daemon = Daemon(loaded, config)
    source = Readings(0.2)
    daemon.source = source
    await daemon.start(handle_signals=False)
    return daemon, source


@contextlib.asynccontextmanager
async def engaged(world: Stack) -> AsyncIterator[tuple[Daemon, Readings]]:
    """A daemon whose rule fires, the fallback engaged through the router and confirmed."""
    daemon, source = await daemon_for(world)
    try:
        await until(
            "the engage is confirmed", lambda: flag_memory(daemon.store.path).get("state") == "engaged"
        )
        yield daemon, source
    finally:
        await daemon.shutdown()


async def pool_of_next(world: Stack) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        return await world.complete(session)


async def test_a_reload_keeps_the_fallback_and_a_stream_in_flight_finishes(tmp_path: Path) -> None:
    async with stack(tmp_path) as world, engaged(world) as (daemon, _):
        assert await pool_of_next(world) == "standard"
        body = {
            "model": MODEL, "prompt": "a long story", "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        text, usage, finish = [], None, None
        url = f"{world.router.url}/v1/completions"
        reload: asyncio.Task[None] | None = None
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
            session.post(url, json=body) as answer,
        ):
            assert answer.status == 200 and answer.headers["X-Specguard-Pool"] == "standard"
            async for line in answer.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    text.append(choice["text"])
                    finish = choice.get("finish_reason") or finish
                if reload is None:  # the stream is under way: nginx reloads under it
                    reload = asyncio.create_task(asyncio.to_thread(world.router.reload))
        assert reload is not None
        reloaded_before_the_end = reload.done()
        await reload
        assert reloaded_before_the_end, "the stream ended before the reload's new workers ran: nothing tested"
        assert finish == "length" and usage is not None and usage["completion_tokens"] == 400, (finish, usage)
        assert world.standard.ground_truth()[-1].completion_tokens == 400  # served to its end

        # the new workers read the flag from the shared dict, not from the file: still engaged
        assert (await world.admin())["fallback"] is True
        assert [await pool_of_next(world) for _ in range(3)] == ["standard"] * 3
        assert [mode for mode, _, _ in fallback_runs(daemon.store.path)] == ["run"]  # nothing written again


async def test_nginx_started_again_during_a_fallback_reads_the_flag_file(tmp_path: Path) -> None:
    async with stack(tmp_path) as world, engaged(world) as (daemon, _):
        await asyncio.to_thread(world.router.stop)
        await asyncio.to_thread(world.router.start)  # a new shared dict: the flag from the file
        state = await world.admin()
        assert (state["fallback"], state["source"]) == (True, "file"), state
        assert [await pool_of_next(world) for _ in range(3)] == ["standard"] * 3
        await asyncio.sleep(0.5)  # a few ticks: the router and its file agree, nothing to put right
        assert (await world.admin())["source"] == "file"
        assert [mode for mode, _, _ in fallback_runs(daemon.store.path)] == ["run"]
        assert flag_memory(daemon.store.path)["state"] == "engaged"


async def test_a_flag_restored_by_hand_while_the_rule_fires_is_put_right(tmp_path: Path) -> None:
    async with stack(tmp_path) as world, engaged(world) as (daemon, source):
        assert (await world.admin("PUT", {"fallback": False}))["fallback"] is False  # by hand
        # specguard reads the router and its file disagree, and writes both again
        deadline = time.monotonic() + 20
        while not (await world.admin())["fallback"]:
            assert time.monotonic() < deadline, flag_memory(daemon.store.path)
            await asyncio.sleep(0.05)
        assert json.loads(world.flag.read_text()) == {"fallback": True}
        assert await pool_of_next(world) == "standard"
        await until(
            "the engage is confirmed again", lambda: flag_memory(daemon.store.path).get("state") == "engaged"
        )
        assert [(mode, status) for mode, _, status in fallback_runs(daemon.store.path)] == [("run", "ok")] * 2
        assert len(flag_memory(daemon.store.path)["spans"]) == 1  # one engagement, put right

        # the rule resolves: after the quiet period both are restored, and the traffic goes back
        source.value = 0.8
        await until(
            "the restore is confirmed", lambda: flag_memory(daemon.store.path).get("state") == "restored"
        )
        assert (await world.admin())["fallback"] is False
        assert json.loads(world.flag.read_text()) == {"fallback": False}
        assert await pool_of_next(world) == "speculative"

        # engaged by hand through the admin location while nothing fires: not specguard's to undo
        runs = fallback_runs(daemon.store.path)
        assert (await world.admin("PUT", {"fallback": True}))["fallback"] is True
        await asyncio.sleep(1.0)  # ten ticks
        assert (await world.admin())["fallback"] is True and fallback_runs(daemon.store.path) == runs
        assert flag_memory(daemon.store.path)["state"] == "restored"


async def test_a_daemon_stopped_between_the_file_and_the_router_completes_the_engage_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("specguard.daemon.runtime.SHUTDOWN_GRACE", 0.5)  # the hung PUT is cut at once
    async with stack(tmp_path) as world:
        putting = asyncio.Event()
        daemon, _ = await daemon_for(world, hang_put=putting)
        try:
            await asyncio.wait_for(putting.wait(), 20)
            # the file written, the router not yet told: the state is unknown, the run under way
            assert json.loads(world.flag.read_text()) == {"fallback": True}
            assert (await world.admin())["fallback"] is False
            assert flag_memory(daemon.store.path)["state"] == "unknown"
            assert fallback_runs(daemon.store.path) == [("run", "firing", "running")]
        finally:
            await daemon.shutdown()  # the write cut short, as by a crash

        daemon, _ = await daemon_for(world)  # specguard again: the router and its file disagree
        try:
            await until(
                "the engage is confirmed", lambda: flag_memory(daemon.store.path).get("state") == "engaged"
            )
            assert (await world.admin())["fallback"] is True
            assert await pool_of_next(world) == "standard"
            # the same run carried out, one engagement: nothing forgotten, nothing twice
            assert fallback_runs(daemon.store.path) == [("run", "firing", "ok")]
            assert len(flag_memory(daemon.store.path)["spans"]) == 1
        finally:
            await daemon.shutdown()
