"""The fallback converges, scenario by scenario, in a daemon as an operator runs it (the real store,
guards, dispatcher and actions; the source, the flag API, the canary's server and Slack on
loopback): what the rules' states say the flag should be is made true, and stays true, whatever
came in between (a silence, a reload, a failed write, a budget, a canary that raised).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from specguard.actions.base import ActionContext
from specguard.actions.slack import SlackAction, SlackParams
from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.dispatch import silences
from specguard.sim import slack_api
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from tests.ports import free_port
from tests.readings import Readings

TWO_RULES = """\
rules:
  - name: {first}
    signal: acceptance_rate
    condition: "< 0.5"
    actions: {first_actions}
  - name: tight
    signal: acceptance_rate
    condition: "< 0.4"
    actions: [fallback]
"""


def config(backend: str, **flag: str) -> str:
    extra = "".join(f"    {key}: {value}\n" for key, value in flag.items())
    return (
        "server: {port: 0}\nstate_dir: state\ninterval: 100ms\nrules: [rules.yaml]\n"
        f"actions:\n  fallback:\n    type: feature_flag\n{extra}{backend}"
    )


FILE = "    file: {path: flags.json, engage: {speculative: false}, restore: {speculative: true}}\n"


def http(port: int) -> str:
    return (
        f"    http: {{url: 'http://127.0.0.1:{port}/flags/speculative', engage: {{speculative: false}}, "
        "restore: {speculative: true}, retries: 0, request_timeout: 1s}\n"
    )


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Daemon]]]:
    running: list[Daemon] = []

    async def start(config_text: str, rules: str, value: float = 0.8) -> Daemon:
        (tmp_path / "specguard.yaml").write_text(config_text)
        (tmp_path / "rules.yaml").write_text(rules)
        loaded = load(tmp_path / "specguard.yaml")
        assert loaded.ok, loaded.problems
        daemon = Daemon(loaded, tmp_path / "specguard.yaml")
        daemon.source = Readings(value)
        await daemon.start(handle_signals=False)
        running.append(daemon)
        return daemon

    yield start
    for daemon in running:
        if daemon.scheduler is not None and daemon.scheduler.running:
            await daemon.shutdown()


async def until(what: str, check: Callable[[], bool], seconds: float = 20.0, shown: Any = None) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}" + (f": {shown()}" if shown else ""))
        await asyncio.sleep(0.02)


async def stays(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), f"no longer true: {what}"
        await asyncio.sleep(0.02)


def flag(tmp_path: Path) -> Any:
    path = tmp_path / "flags.json"
    return json.loads(path.read_text()) if path.exists() else None


def engaged(tmp_path: Path) -> bool:
    return flag(tmp_path) == {"speculative": False}


def restored(tmp_path: Path) -> bool:
    return flag(tmp_path) == {"speculative": True}


def runs(daemon: Daemon, action: str = "fallback") -> list[dict[str, Any]]:
    db = sqlite3.connect(daemon.store.path)
    db.row_factory = sqlite3.Row
    rows = db.execute(
        "SELECT r.*, e.rule, e.kind, e.labels FROM action_runs r JOIN events e ON e.id = r.event_id "
        "WHERE r.action = ? ORDER BY r.id",
        (action,),
    )
    return [dict(row) for row in rows]


def source(daemon: Daemon) -> Readings:
    assert isinstance(daemon.source, Readings)
    return daemon.source


@dataclass
class FlagApi:
    """A flag service: answers each PUT with the next status of ``script`` (200 when empty), or
    ``restores`` for a restore while it is set; keeps the flag as the last accepted write."""

    port: int
    requests: list[tuple[Any, int]] = field(default_factory=list)
    script: list[int] = field(default_factory=list)
    restores: int | None = None  # the status every restore gets, while set
    value: Any = None
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        status = self.script.pop(0) if self.script else 200
        if self.restores is not None and body == {"speculative": True}:
            status = self.restores
        self.requests.append((body, status))
        if status < 300:
            self.value = body
        return web.json_response({"ok": status < 300}, status=status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_put("/flags/speculative", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def flag_api() -> AsyncIterator[FlagApi]:
    api = FlagApi(free_port())
    yield api
    await api.stop()


# --- 1. a firing under a silence is acted on when the silence ends --------------------------------


async def test_a_firing_under_a_silence_engages_the_flag_and_pages_once_when_the_silence_ends(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path
) -> None:
    async with slack_api.running() as slack:
        (tmp_path / "slack-token").write_text(slack_api.TOKEN)
        text = config(FILE, quiet_period="300ms") + (
            "  oncall:\n    type: slack\n    token: {file: slack-token}\n    channel: C0ONCALL\n"
            f"    base_url: {slack.url}\n    group_wait: 0s\n"
        )
        rules = TWO_RULES.format(first="collapse", first_actions="[fallback, oncall]")
        daemon = await started(text, rules)
        now = time.time()
        silence = await daemon.store.call(
            lambda db: silences.add(db, "collapse", {}, now, now + 1.5, "deploying a new draft", "ops", now)
        )
        source(daemon).value = 0.45  # `collapse` fires, under the silence
        await until(
            "its firing is deferred", lambda: len(runs(daemon)) == 1 and len(runs(daemon, "oncall")) == 1
        )
        for run in (runs(daemon)[0], runs(daemon, "oncall")[0]):
            assert (run["status"], run["not_before"]) == ("deferred", silence.ends)
            assert run["reason"].startswith(f"silenced: by silence {silence.id} until ")
        assert not engaged(tmp_path) and slack.posted() == []
        # /api/status says what waits and why, and what the flag should be
        await until("the status shows both waiting", lambda: len(daemon.status()["waiting"]) == 2)
        waiting = {w["action"]: w for w in daemon.status()["waiting"]}
        assert {name: (w["status"], w["until"], w["rule"]) for name, w in waiting.items()} == {
            "fallback": ("deferred", silence.ends, "collapse"),
            "oncall": ("deferred", silence.ends, "collapse"),
        }
        assert waiting["oncall"]["why"].startswith(f"silenced: by silence {silence.id} until ")
        shown = daemon.status()["fallbacks"]["fallback"]
        assert (shown["should_be"], shown["holders"]) == ("alone", ['collapse{instance="vllm-a:8000"}'])
        await until("the flag is engaged once the silence ends", lambda: engaged(tmp_path))
        await until("its run is recorded", lambda: runs(daemon)[0]["status"] == "ok")
        await until(
            "the status says so", lambda: daemon.status()["fallbacks"]["fallback"]["should_be"] == "engaged"
        )
        assert daemon.status()["fallbacks"]["fallback"]["why"] == 'held by collapse{instance="vllm-a:8000"}'
        (engage,) = runs(daemon)
        assert (engage["mode"], engage["status"]) == ("run", "ok") and engage["started"] >= silence.ends

        def parents() -> list[dict[str, Any]]:
            return [m for m in slack.posted() if not m.get("thread_ts")]

        await until("on-call is paged", lambda: len(parents()) == 1)
        await stays("paged once", lambda: len(parents()) == 1 and engaged(tmp_path), 1.0)
        assert all(m["thread_ts"] == parents()[0]["ts"] for m in slack.posted() if m.get("thread_ts"))
        (page,) = runs(daemon, "oncall")
        assert page["status"] == "ok" and page["started"] >= silence.ends


# --- 2. a holder whose rule a reload removes, renames, disables or unhooks lets go ------------------


@pytest.mark.parametrize("change", ["removed", "renamed", "disabled", "unhooked"])
async def test_a_flag_held_by_a_rule_a_reload_takes_away_is_restored(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path, change: str
) -> None:
    daemon = await started(
        config(FILE, quiet_period="300ms"), TWO_RULES.format(first="loose", first_actions="[fallback]")
    )
    source(daemon).value = 0.3  # both rules fire
    await until("engaged", lambda: engaged(tmp_path))
    rules = {
        "removed": TWO_RULES.split("  - name: {first}")[0]
        + "  - name: tight"
        + TWO_RULES.split("  - name: tight")[1],
        "renamed": TWO_RULES.format(first="loose_v2", first_actions="[fallback]"),
        "disabled": TWO_RULES.format(first="loose", first_actions="[fallback]\n    enabled: false"),
        "unhooked": TWO_RULES.format(first="loose", first_actions="[log]"),
    }[change]
    (tmp_path / "rules.yaml").write_text(rules.replace("{first}", "loose"))
    assert await daemon.reload()
    await stays("engaged while `tight` fires", lambda: engaged(tmp_path), 0.5)
    source(daemon).value = 0.8  # every configured series resolves; `loose`'s series are gone with it
    await until("restored after the quiet period", lambda: restored(tmp_path))
    # (a restore planned while `tight` had not been evaluated since the reload is called off, and
    # recorded so; the one that is done is on the resolution of the last series that held it)
    await until(
        "the restore is recorded",
        lambda: [r["status"] for r in runs(daemon) if r["mode"] == "restore"][-1:] == ["ok"],
        shown=lambda: [
            (r["rule"], r["kind"], r["mode"], r["status"], r["reason"], r["detail"]) for r in runs(daemon)
        ],
    )
    done = [run for run in runs(daemon) if run["mode"] == "restore" and run["status"] == "ok"]
    assert [run["kind"] for run in done] == ["resolved"] and done[0]["rule"] != "loose"


async def test_a_rule_disabled_and_enabled_again_while_it_breaches_fires_anew(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path
) -> None:
    """A disabled rule's series are forgotten as a removed rule's are; enabled again while the
    breach goes on, the breach is a new firing (with its own page), as in Prometheus."""
    rules = TWO_RULES.format(first="loose", first_actions="[log]")
    daemon = await started(config(FILE), rules)
    source(daemon).value = 0.45  # `loose` fires, `tight` does not

    def firings() -> list[int]:
        return [r["event_id"] for r in runs(daemon, "log") if r["rule"] == "loose" and r["kind"] == "firing"]

    await until("loose fires", lambda: len(firings()) == 1)
    (tmp_path / "rules.yaml").write_text(
        rules.replace("actions: [log]", "actions: [log]\n    enabled: false")
    )
    assert await daemon.reload()
    assert "loose" not in daemon.states and "loose" not in await daemon.store.load_states()
    (tmp_path / "rules.yaml").write_text(rules)
    assert await daemon.reload()
    await until("loose fires again, a firing of its own", lambda: len(firings()) == 2, shown=firings)
    assert firings()[1] > firings()[0]


# --- 3. a failed engage is tried again until the flag API answers ----------------------------------


async def test_a_failed_engage_is_tried_again_until_the_flag_api_answers(
    started: Callable[..., Awaitable[Daemon]], flag_api: FlagApi
) -> None:
    text = config(http(flag_api.port), retry_backoff="200ms", retry_max_backoff="400ms")
    daemon = await started(text, TWO_RULES.format(first="loose", first_actions="[fallback]"))
    source(daemon).value = 0.45  # the flag API refuses connections: nothing listens yet
    # The run's detail is written after the flag's record: once it names the failure, both hold it.
    await until("the engage failed once", lambda: bool(runs(daemon)) and "cannot connect" in (runs(daemon)[0]["detail"] or "").lower())  # fmt: skip
    failed = runs(daemon)[0]
    assert failed["status"] in ("pending", "running") and failed["attempts"] >= 1
    record = await daemon.store.memory_read("fallback", "flag")
    assert record["state"] == "unknown" and record["failures"] >= 1
    await flag_api.start()
    await until("engaged through the API", lambda: flag_api.value == {"speculative": False})
    await until("the run is done", lambda: runs(daemon)[0]["status"] == "ok")
    (engage,) = runs(daemon)
    assert engage["attempts"] >= 2 and engage["detail"].startswith("fallback engaged: PUT")
    assert (await daemon.store.memory_read("fallback", "flag"))["state"] == "engaged"


# --- 4. a failed restore leaves the series a holder when it fires again ----------------------------


async def test_a_series_firing_again_after_a_failed_restore_holds_the_flag_whoever_else_lets_go(
    started: Callable[..., Awaitable[Daemon]], flag_api: FlagApi
) -> None:
    await flag_api.start()
    text = config(http(flag_api.port), quiet_period="200ms", retry_backoff="200ms", retry_max_backoff="200ms")
    daemon = await started(text, TWO_RULES.format(first="loose", first_actions="[fallback]"))
    source(daemon).value = 0.45  # `loose` fires
    await until("engaged", lambda: flag_api.value == {"speculative": False})
    flag_api.restores = 503
    source(daemon).value = 0.8  # resolves; its restore fails
    await until("a restore was refused", lambda: any(s == 503 for _, s in flag_api.requests))
    source(daemon).value = 0.45  # `loose` fires again
    await asyncio.sleep(0.3)
    source(daemon).value = 0.3  # `tight` fires too ...
    await until("tight fires", lambda: daemon.states.get("tight", {}) != {} and any(
        s.state.value == "firing" for s in daemon.states["tight"].values()))  # fmt: skip
    await asyncio.sleep(0.3)
    source(daemon).value = 0.45  # ... and resolves, while `loose` still fires
    flag_api.restores = None  # the API would take a restore now
    await stays("engaged while `loose` fires", lambda: flag_api.value == {"speculative": False}, 1.5)
    assert all(body == {"speculative": False} for body, status in flag_api.requests if status < 300)


# --- 5. a hold that changes nothing is not held back by the budget ---------------------------------


async def test_a_second_rule_holds_an_engaged_flag_whatever_the_budget(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path
) -> None:
    rules = """\
rules:
  - name: tight
    signal: acceptance_rate
    condition: "< 0.4"
    actions: [fallback]
  - name: loose
    signal: acceptance_rate
    condition: "< 0.5"
    actions: [fallback]
"""
    daemon = await started(config(FILE, quiet_period="200ms", budget="{runs: 1, per: 1h}"), rules)
    source(daemon).value = 0.3  # both fire: one engagement, the budget's only one this hour
    await until("engaged", lambda: engaged(tmp_path))
    await until("both answered", lambda: len(runs(daemon)) == 2)
    # whichever was looked at first engaged it; the other met it engaged: a hold, spending no budget
    answers = sorted((run["mode"], run["status"]) for run in runs(daemon))
    assert answers == [("hold", "ok"), ("run", "ok")], runs(daemon)
    source(daemon).value = 0.45  # `tight` resolves; `loose` still fires and holds it
    await stays("engaged while `loose` fires", lambda: engaged(tmp_path), 1.0)
    source(daemon).value = 0.8
    await until("restored once nothing fires", lambda: restored(tmp_path))


# --- 6. firing again under a silence in the quiet period keeps the flag --------------------------


async def test_a_rule_firing_again_under_a_silence_during_the_quiet_period_keeps_the_flag(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path
) -> None:
    daemon = await started(
        config(FILE, quiet_period="1s"), TWO_RULES.format(first="loose", first_actions="[fallback]")
    )
    source(daemon).value = 0.3
    await until("engaged", lambda: engaged(tmp_path))
    source(daemon).value = 0.8  # both resolve: the restore waits out the quiet period
    await until("a restore is planned", lambda: any(r["mode"] == "restore" for r in runs(daemon)))
    now = time.time()
    await daemon.store.call(lambda db: silences.add(db, "*", {}, now, now + 3600, "draft swap", "ops", now))
    source(daemon).value = 0.45  # `loose` fires again, silenced
    await stays("engaged while `loose` fires, silenced", lambda: engaged(tmp_path), 2.0)
    (restore,) = [r for r in runs(daemon) if r["mode"] == "restore"]
    assert restore["status"] == "skipped" and restore["reason"].startswith("called off: kept: loose")
    source(daemon).value = 0.8
    await until("restored once nothing fires", lambda: restored(tmp_path))


# --- 7. a restore whose canary raised is tried again ----------------------------------------------


@dataclass
class CanaryServer:
    """Enough of a speculative vLLM for the canary: each completion proposes 10 draft tokens and
    has 8 accepted; the first ``broken`` answers claim an impossible token count."""

    broken: int = 1
    accepted: float = 0.0
    drafted: float = 0.0

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "tiny"}]})

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(
                text="# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
                f"vllm:spec_decode_num_accepted_tokens_total {self.accepted}\n"
                "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
                f"vllm:spec_decode_num_draft_tokens_total {self.drafted}\n"
            )

        async def complete(request: web.Request) -> web.Response:
            self.accepted += 8
            self.drafted += 10
            tokens = "1e999" if self.broken > 0 else "16"
            self.broken -= 1
            return web.Response(
                text=f'{{"usage": {{"completion_tokens": {tokens}}}}}', content_type="application/json"
            )

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", complete)
        return app


async def test_a_restore_whose_canary_raised_is_tried_again_and_done(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = CanaryServer()
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        canary = (
            f"{{url: 'http://127.0.0.1:{port}', min_acceptance: 0.5, requests: 1, min_draft_tokens: 5, "
            "timeout: 5s}"
        )
        # an answer that cannot be so fails the canary: tried again after restore_backoff
        text = config(
            FILE, quiet_period="100ms", retry_backoff="200ms", restore_backoff="200ms", canary=canary
        )
        daemon = await started(text, TWO_RULES.format(first="loose", first_actions="[fallback]"))
        source(daemon).value = 0.45
        await until("engaged", lambda: engaged(tmp_path))
        source(daemon).value = 0.8
        await until("restored after the canary's second look", lambda: restored(tmp_path))
        await until("the restore is recorded", lambda: runs(daemon)[-1]["status"] == "ok")
        restore = runs(daemon)[-1]
        assert (restore["mode"], restore["status"]) == ("restore", "ok") and restore["attempts"] == 2
        assert "canary: acceptance 0.80" in restore["detail"]
        assert [r.getMessage() for r in caplog.records if r.exc_info] == []  # a failed canary, no traceback
    finally:
        await runner.cleanup()


# --- 10. a Slack run repeated for the same firing posts once, in one thread -------------------------


async def test_a_slack_run_repeated_for_the_same_firing_queues_one_post(store: Store, tmp_path: Path) -> None:
    async with slack_api.running() as slack:
        (tmp_path / "token").write_text(slack_api.TOKEN)
        token = {"file": str(tmp_path / "token")}
        params = SlackParams.model_validate(
            {"type": "slack", "token": token, "channel": "C0ONCALL", "base_url": slack.url, "group_wait": 0}
        )
        action = SlackAction("oncall", params)
        memory = StoreMemory(store, "oncall")
        ctx = ActionContext(
            rule="collapse", event="firing", severity="critical", labels={"instance": "a"}, value=0.1,
            threshold=0.5, summary="acceptance 0.1", event_id=7, series='{"instance":"a"}', at=time.time(),
            memory=memory,
        )  # fmt: skip
        assert (await action.run(ctx)).ok
        again = await action.run(ctx)  # the run cut short by a kill, carried out again after the restart
        assert again.ok and "already" in again.detail
        await action.tick(memory)
        resolved = ActionContext(**{**ctx.__dict__, "event": "resolved", "event_id": 8})
        assert (await action.run(resolved)).ok
        await action.tick(memory)
        parents = [m for m in slack.posted() if not m.get("thread_ts")]
        assert len(parents) == 1
        assert [m["thread_ts"] for m in slack.posted() if m.get("thread_ts")] == [parents[0]["ts"]]


async def test_a_reload_that_removes_an_engaged_flag_says_it_is_left_as_it_is(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = await started(config(FILE), TWO_RULES.format(first="loose", first_actions="[fallback]"))
    source(daemon).value = 0.3
    await until("engaged", lambda: engaged(tmp_path))
    (tmp_path / "specguard.yaml").write_text(
        "server: {port: 0}\nstate_dir: state\ninterval: 100ms\nrules: [rules.yaml]\n"
    )
    (tmp_path / "rules.yaml").write_text(
        TWO_RULES.format(first="loose", first_actions="[log]").replace("[fallback]", "[log]")
    )
    assert await daemon.reload()
    assert (
        "the feature_flag action fallback is gone while its flag may be engaged: it is left as it is"
        in caplog.text
    )
    await stays("left as it is", lambda: engaged(tmp_path), 0.5)
