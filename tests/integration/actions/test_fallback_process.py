"""The fallback on the real stack: `specguard run` in its own process scrapes a simulated vLLM with
speculative decoding whose acceptance collapses under hot traffic; the traffic goes through the demo's
router, which sends each request to that server or to a standard-decoding one as the flag file says;
on-call is told through the loopback Slack Web API.

- A silence over the start of a collapse holds back the fallback and the page (recorded as deferred
  until the silence's end); once it runs out the flag is engaged within a tick and on-call is paged
  once.
- A daemon killed (SIGKILL) while its restore's reload command runs completes the restore when it
  starts again: the flag goes engaged -> restored once, and Slack keeps one thread for the incident.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.actions.feature_flag.backends import render
from specguard.sim.flag_router import FlagRouter
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.slack_api import TOKEN, SlackApi, running
from specguard.sim.traffic import Traffic
from tests.ports import free_port
from tests.processes import Daemon, specguard
from tests.statedb import flag_memory, runs, until

RULE = "acceptance_low"
INTERVAL = 1.0  # the rule's evaluation interval, seconds
LOADED_MACHINE = 1.0  # allowance, seconds, for a loaded 2-core machine
HOT, HEALTHY = 1.5, 0.0  # sampling temperatures
CHANNEL = "C0ONCALL"
ENGAGE, RESTORE = {"speculative": False}, {"speculative": True}

RULES = f"""\
rules:
  - name: {RULE}
    signal: acceptance_rate
    window: 3s
    interval: 1s
    condition: "< 0.5"
    severity: critical
    actions: [fallback, oncall]
"""

# The flag file's reload command: notes what the file says when it runs, sleeps (a slow router
# reload), then notes that it is done.
RELOAD = """\
import json, os, sys, time
flag, log = sys.argv[1], sys.argv[2]
with open(flag) as f:
    said = json.load(f)
with open(log, "a") as out:
    out.write(json.dumps({"pid": os.getpid(), "at": time.time(), "speculative": said.get("speculative")}) + "\\n")
time.sleep(3)
with open(log, "a") as out:
    out.write(json.dumps({"pid": os.getpid(), "done": time.time()}) + "\\n")
"""


async def stays(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), f"no longer true: {what}"
        await asyncio.sleep(0.02)


def reads(path: Path) -> str | None:
    """``engaged`` or ``restored`` as the flag file reads now (None: neither, or missing)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return {render("json", ENGAGE): "engaged", render("json", RESTORE): "restored"}.get(text)


async def history(config: Path) -> list[dict[str, Any]]:
    code, out, err = await specguard("history", "--config", str(config), "--rule", RULE, "--format", "json")
    assert code == 0, err
    return list(json.loads(out))


def thread(slack: SlackApi) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the top-level messages, the replies) posted to the channel."""
    posted = [m for m in slack.posted() if m["channel"] == CHANNEL]
    return [m for m in posted if not m.get("thread_ts")], [m for m in posted if m.get("thread_ts")]


def posted(slack: SlackApi) -> float:
    """When the first message was posted (the Slack API's clock)."""
    return next(at for method, at, _ in slack.calls if method == "chat.postMessage")


@dataclass
class Stack:
    """The two simulated servers, the router between them, the traffic through it, Slack."""

    directory: Path
    speculative: Simulator
    standard: Simulator
    slack: SlackApi
    router: FlagRouter
    traffic: Traffic
    routed: list[tuple[bool, str]] = field(default_factory=list)  # the router's changes

    @property
    def flag(self) -> Path:
        return self.directory / "flag.json"

    @property
    def db(self) -> Path:
        return self.directory / "state" / "specguard.db"

    def served_by(self, server: Simulator) -> int:
        return self.traffic.stats.by_server[server.url]

    def config(self, port: int, fallback: str) -> Path:
        (self.directory / "rules.yaml").write_text(RULES)
        (self.directory / "slack-token").write_text(TOKEN)
        path = self.directory / "specguard.yaml"
        path.write_text(
            f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\nrules: [rules.yaml]\n"
            f"sources: {{scrape: {{targets: [{self.speculative.url}/metrics]}}}}\n"
            f"actions:\n  fallback:\n    type: feature_flag\n{fallback}"
            f"  oncall:\n    type: slack\n    token: {{file: slack-token}}\n    channel: {CHANNEL}\n"
            f"    base_url: {self.slack.url}\n    group_wait: 0s\n    backoff: 200ms\n    max_backoff: 500ms\n"
        )
        return path


@contextlib.asynccontextmanager
async def stack(directory: Path) -> AsyncIterator[Stack]:
    """Everything but specguard, running: healthy traffic on speculative decoding, the flag file
    as a deploy leaves it (restored). Stopped on the way out."""
    (directory / "flag.json").write_text(render("json", RESTORE))
    speculative = await start_simulator(
        SimOptions(
            port=free_port(),
            step_time=0.004,
            seed=3,
            speculative=SpeculativeConfig("draft_model", "tiny-draft", 4),
            # the demo's draft: acceptance ~0.68 at temperature 0, ~0.04 at 1.5 (measured)
            acceptance_by_position=[0.85],
            temperature_decay=1.2,
        )
    )
    try:
        standard = await start_simulator(SimOptions(port=free_port(), step_time=0.004, seed=4))
        try:
            async with running() as slack:
                routed: list[tuple[bool, str]] = []
                router = FlagRouter(
                    directory / "flag.json",
                    speculative.url,
                    standard.url,
                    lambda value, server: routed.append((value, server)),
                )
                traffic = Traffic(
                    speculative.url,
                    speculative.options.model,
                    concurrency=4,
                    max_tokens=48,
                    temperature=HEALTHY,
                    route=router,
                )
                await traffic.start()
                try:
                    yield Stack(directory, speculative, standard, slack, router, traffic, routed)
                finally:
                    await traffic.stop()
        finally:
            await standard.stop()
    finally:
        await speculative.stop()


async def evaluating(daemon: Daemon) -> None:
    """Wait until the daemon has judged the rule on data (the scrape source warmed up)."""
    await daemon.wait_for(
        lambda s: any(r["rule"] == RULE and r["verdict"] == "ok" for r in s["rules"]), timeout=60
    )


def stopped(daemon: Daemon) -> None:
    if daemon.process is not None and daemon.process.poll() is None:
        daemon.stop()


# --- 1. a silence over the start of a collapse, then its end -------------------------------------


async def test_a_collapse_under_a_silence_engages_the_flag_and_pages_once_within_a_tick_of_its_end(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    async with stack(tmp_path) as world:
        port = free_port()
        config = world.config(port, "    file: {path: flag.json, engage: {speculative: false}, "
                                    "restore: {speculative: true}}\n    quiet_period: 60s\n")  # fmt: skip
        daemon = Daemon(config, port, tmp_path / "specguard.log")
        daemon.start()
        try:
            await evaluating(daemon)
            code, out, err = await specguard(
                "silence", "add", "--rule", RULE, "--for", "20s", "--reason", "deploying a new draft",
                "--config", str(config),
            )  # fmt: skip
            assert code == 0, err
            world.traffic.temperature = HOT  # acceptance collapses, under the silence
            code, out, err = await specguard("silence", "list", "--format", "json", "--config", str(config))
            assert code == 0, err
            (silence,) = json.loads(out)
            ends = float(silence["ends"])

            await until(
                "the firing's fallback and page are deferred",
                lambda: [r["status"] for r in runs(world.db, "fallback")] == ["deferred"]
                and [r["status"] for r in runs(world.db, "oncall")] == ["deferred"],
                shown=lambda: (runs(world.db, "fallback"), runs(world.db, "oncall"), daemon.log.read_text()[-2000:]),
            )  # fmt: skip
            (deferred,) = runs(world.db, "fallback")
            assert deferred["event_at"] < ends, "the rule fired after the silence ended: it covers nothing"
            shown = await history(config)
            (firing,) = [e for e in shown if e["kind"] == "firing"]
            by_action = {run["action"]: run for run in firing["runs"]}
            assert set(by_action) == {"fallback", "oncall"}, firing["runs"]
            for run in by_action.values():
                assert (run["status"], run["mode"], run["not_before"]) == ("deferred", "run", ends), run
                assert run["reason"].startswith(f"silenced: by silence {silence['id']} until "), run
            # while silenced: the flag as the deploy left it, traffic on speculation, Slack told nothing
            assert reads(world.flag) == "restored" and world.slack.posted() == []
            await stays(
                "nothing acts while the silence holds",
                lambda: reads(world.flag) == "restored" and world.slack.posted() == [] and world.router.speculative,
                max(0.0, ends - time.time() - 1.0),
            )  # fmt: skip

            # the silence runs out: the flag is engaged, the router moves the traffic, on-call is paged
            await until("the flag is engaged", lambda: reads(world.flag) == "engaged")
            await until(
                "the engage is recorded done", lambda: [r["status"] for r in runs(world.db, "fallback")] == ["ok"]
            )  # fmt: skip
            (engage,) = runs(world.db, "fallback")
            assert engage["id"] == deferred["id"] and engage["mode"] == "run", engage
            delay, allowed = engage["started"] - ends, INTERVAL + LOADED_MACHINE
            print(f"engage started {delay:.3f} s after the silence's end (allowed {allowed:g} s)")
            assert engage["started"] >= ends, f"engaged {-delay:.3f} s before the silence's end"
            assert delay <= allowed, f"engaged {delay:.3f} s after the silence's end, more than {allowed:g} s"
            on_standard = world.served_by(world.standard)
            await until(
                "the router sends traffic to standard decoding",
                lambda: not world.router.speculative and world.served_by(world.standard) >= on_standard + 4,
            )
            assert world.routed[0] == (False, world.standard.url), world.routed

            await until("on-call is paged", lambda: len(thread(world.slack)[0]) == 1)
            await stays(
                "paged once, the flag engaged",
                lambda: len(thread(world.slack)[0]) == 1 and reads(world.flag) == "engaged",
                3.0,
            )
            (page,) = runs(world.db, "oncall")
            assert page["status"] == "ok" and page["started"] >= ends, page
            print(f"page queued {page['started'] - ends:.3f} s, posted {posted(world.slack) - ends:.3f} s after "
                  "the silence's end")  # fmt: skip
            (parent,), replies = thread(world.slack)
            assert all(reply["thread_ts"] == parent["ts"] for reply in replies), replies
            assert parent["blocks"][0]["text"]["text"] == f"FIRING · CRITICAL · {RULE}", parent

            shown = await history(config)
            (firing,) = [e for e in shown if e["kind"] == "firing"]
            by_action = {run["action"]: run for run in firing["runs"]}
            assert (by_action["fallback"]["mode"], by_action["fallback"]["status"]) == ("run", "ok")
            assert by_action["oncall"]["status"] == "ok", by_action
        finally:
            stopped(daemon)
    print(f"test took {time.monotonic() - began:.1f} s")


# --- 2. SIGKILL during a restore --------------------------------------------------------------------


def reload_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unfinished(path: Path) -> list[int]:
    """The reload commands that started and have not ended, by pid."""
    entries = reload_log(path)
    ended = {e["pid"] for e in entries if "done" in e}
    return [e["pid"] for e in entries if "at" in e and e["pid"] not in ended]


async def watch(path: Path, seen: list[str | None]) -> None:
    """Every state the flag file is in, in order (each change once)."""
    while True:
        now = reads(path)
        if not seen or seen[-1] != now:
            seen.append(now)
        await asyncio.sleep(0.01)


async def test_a_daemon_killed_during_a_restore_completes_it_once_and_keeps_one_slack_thread(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    script, log = tmp_path / "reload.py", tmp_path / "reloads.log"
    script.write_text(RELOAD)
    async with stack(tmp_path) as world:
        port = free_port()
        reload = json.dumps([sys.executable, str(script), str(world.flag), str(log)])
        config = world.config(
            port,
            "    file: {path: flag.json, engage: {speculative: false}, restore: {speculative: true}, "
            f"reload: {reload}, reload_timeout: 10s}}\n"
            "    quiet_period: 2s\n    retry_backoff: 1s\n    restore_backoff: 2s\n    timeout: 40s\n"
            f"    canary: {{url: '{world.speculative.url}', min_acceptance: 0.4, requests: 4, max_tokens: 32, "
            "temperature: 0, timeout: 20s}\n",
        )
        # the fallback rule resolves once its server has no traffic to judge, as the demo's does
        (tmp_path / "rules.yaml").write_text(RULES + "    no_data: ok\n")
        states: list[str | None] = []
        watcher = asyncio.create_task(watch(world.flag, states))
        daemon = Daemon(config, port, tmp_path / "specguard.log")
        daemon.start()
        try:
            await evaluating(daemon)
            world.traffic.temperature = HOT
            await until("the flag is engaged", lambda: reads(world.flag) == "engaged")
            await until("on-call's thread is started", lambda: len(thread(world.slack)[0]) == 1)
            await until("the router moved the traffic", lambda: not world.router.speculative)
            world.traffic.temperature = HEALTHY  # the hot traffic ends, served by standard decoding

            # the rule resolves (no data), the quiet period passes, the canary agrees: the restore
            # writes the file and its reload runs; specguard is killed in the middle of it
            await until(
                "the restore's reload runs",
                lambda: any(entry.get("speculative") is True for entry in reload_log(log)),
                shown=lambda: (reload_log(log), runs(world.db, "fallback")),
            )
            assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
            killed = time.time()
            (cut,) = [e for e in reload_log(log) if e.get("speculative") is True]
            assert cut["pid"] in unfinished(log), "the kill came after the restore's reload had ended"
            (restore,) = [r for r in runs(world.db, "fallback") if r["mode"] == "restore"]
            assert (restore["status"], restore["kind"]) == ("running", "resolved"), restore
            assert flag_memory(world.db)["state"] == "unknown", flag_memory(world.db)

            daemon.start()  # specguard again: the restore is carried out anew, its reload with it
            await until(
                "the restore is recorded done",
                lambda: [r["status"] for r in runs(world.db, "fallback") if r["mode"] == "restore"] == ["ok"],
                shown=lambda: (runs(world.db, "fallback"), daemon.log.read_text()[-2000:]),
            )
            assert reads(world.flag) == "restored"
            on_speculative = world.served_by(world.speculative)
            await until(
                "the router sends traffic back to speculative decoding",
                lambda: world.router.speculative and world.served_by(world.speculative) >= on_speculative + 4,
            )
            await until(
                "the restore is told in the thread",
                lambda: any(r["text"].startswith("fallback (restore): ok") for r in thread(world.slack)[1]),
                shown=lambda: world.slack.posted(),
            )
            await stays(
                "one thread, the flag restored",
                lambda: len(thread(world.slack)[0]) == 1 and reads(world.flag) == "restored",
                3.0,
            )
            # every reload runs to its end, the one left running by specguard's death too
            await until("the reload commands are over", lambda: not unfinished(log), seconds=20)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            stopped(daemon)
            for pid in unfinished(log):  # a reload still running is ended (ours, by its pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        # the world went engaged -> restored once: what each reload saw in the file, the file as
        # watched, the router's changes
        saw = [e["speculative"] for e in reload_log(log) if "at" in e]
        assert saw[:2] == [False, True] and all(saw[2:]), f"the flag file as each reload saw it: {saw}"
        assert any(e["at"] > killed for e in reload_log(log) if e.get("speculative") is True), (
            "the restore's reload did not run again after the restart"
        )
        assert states == ["restored", "engaged", "restored"], f"the flag file went {states}"
        assert world.routed == [(False, world.standard.url), (True, world.speculative.url)], world.routed
        memory = flag_memory(world.db)
        assert memory["state"] == "restored" and len(memory["spans"]) == 1, memory
        assert memory["spans"][0]["restored"] is not None, memory

        # one thread: the firing's message, its news as replies, none twice
        (parent,), replies = thread(world.slack)
        texts = [reply["text"] for reply in replies]
        assert all(reply["thread_ts"] == parent["ts"] for reply in replies), replies
        assert len(texts) == len(set(texts)), f"a reply posted twice: {texts}"
        assert len([t for t in texts if t.startswith("Resolved at")]) == 1, texts
        assert len([t for t in texts if t.startswith("fallback (restore):")]) == 1, texts
        notices = [m["metadata"]["event_payload"]["notice"] for m in world.slack.posted() if m["metadata"]]
        assert len(notices) == len(set(notices)), f"a notice posted twice: {notices}"

        shown = await history(config)
        restores = [
            (event["kind"], run)
            for event in shown
            for run in event["runs"]
            if run["action"] == "fallback" and run["mode"] == "restore"
        ]
        assert len(restores) == 1, restores
        kind, run = restores[0]
        assert (kind, run["status"]) == ("resolved", "ok") and run["attempts"] >= 2, run
        (fired,) = [event["at"] for event in shown if event["kind"] == "firing"]
        print(f"restore: {run['attempts']} attempts, reloads saw {saw}; page posted "
              f"{posted(world.slack) - fired:.1f} s after the firing; replies: {texts}")  # fmt: skip
    print(f"test took {time.monotonic() - began:.1f} s")
