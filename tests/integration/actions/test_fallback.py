"""The fallback loop in a daemon, configured as an operator would: acceptance drops, the rule
fires, the flag file is written; acceptance recovers, the rule resolves, and after the quiet
period the flag is set back. A restart in the middle changes nothing of it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from tests.readings import Readings

CONFIG = """\
server: {port: 0}
state_dir: state
interval: 100ms
rules: [rules.yaml]
actions:
  fallback:
    type: feature_flag
    quiet_period: 1s
    file:
      path: router/flags.json
      engage: {speculative: false}
      restore: {speculative: true}
"""
RULES = """\
rules:
  - name: acceptance_critical
    signal: acceptance_rate
    condition: "< 0.4"
    window: 10s
    severity: critical
    actions: [fallback, log]
"""


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Daemon]]]:
    (tmp_path / "router").mkdir()
    (tmp_path / "specguard.yaml").write_text(CONFIG)
    (tmp_path / "rules.yaml").write_text(RULES)
    running: list[Daemon] = []

    async def start(acceptance: float = 0.8) -> Daemon:
        loaded = load(tmp_path / "specguard.yaml")
        assert loaded.ok, loaded.problems
        daemon = Daemon(loaded, tmp_path / "specguard.yaml")
        daemon.source = Readings()
        daemon.source.value = acceptance
        await daemon.start(handle_signals=False)
        running.append(daemon)
        return daemon

    yield start
    for daemon in running:
        if daemon.scheduler is not None and daemon.scheduler.running:
            await daemon.shutdown()


async def until(what: str, check: Callable[[], bool], seconds: float = 20.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for: {what}")


def flag(tmp_path: Path) -> object:
    path = tmp_path / "router" / "flags.json"
    return json.loads(path.read_text()) if path.exists() else None


def runs(daemon: Daemon) -> list[tuple[str, str, str, str, float | None, float | None]]:
    db = sqlite3.connect(daemon.store.path)
    return list(
        db.execute(
            "SELECT r.action, r.mode, e.kind, r.status, r.started, e.at FROM action_runs r "
            "JOIN events e ON e.id = r.event_id ORDER BY r.id"
        )
    )


async def test_the_flag_is_engaged_on_firing_and_restored_after_the_quiet_period(
    started: Callable[..., Awaitable[Daemon]], tmp_path: Path
) -> None:
    daemon = await started()
    source = daemon.source
    assert isinstance(source, Readings)
    source.value = 0.2
    await until("the flag is engaged", lambda: flag(tmp_path) == {"speculative": False})

    # a restart while engaged: the flag's state is in the store, nothing is engaged twice
    await daemon.shutdown()
    daemon = await started(acceptance=0.2)
    source = daemon.source
    assert isinstance(source, Readings)
    await asyncio.sleep(0.3)
    assert sorted((a, m, k, s) for a, m, k, s, _, _ in runs(daemon)) == [
        ("fallback", "run", "firing", "ok"),
        ("log", "run", "firing", "ok"),
    ]
    source.value = 0.8
    await until("the flag is restored", lambda: flag(tmp_path) == {"speculative": True})
    await until(
        "the restore run is recorded", lambda: any(r[1] == "restore" and r[3] == "ok" for r in runs(daemon))
    )
    rows = sorted(runs(daemon), key=lambda r: (r[2] != "firing", r[0], r[1]))
    assert [(a, m, k, s) for a, m, k, s, _, _ in rows] == [
        ("fallback", "run", "firing", "ok"),
        ("log", "run", "firing", "ok"),
        ("fallback", "restore", "resolved", "ok"),
        ("log", "run", "resolved", "ok"),
    ]
    _, _, _, _, started_at, resolved_at = rows[2]
    assert started_at is not None and resolved_at is not None
    assert started_at >= resolved_at + 1.0  # the quiet period, on the recorded times
    memory = await daemon.store.memory_read("fallback", "flag")
    assert memory["engaged"] is False and memory["holders"] == {}
    assert (tmp_path / "router" / "flags.json.prev").exists()


async def test_on_call_hears_of_it_in_one_slack_thread(tmp_path: Path) -> None:
    """The same loop with the slack action after the fallback: the firing message says the
    fallback was engaged; the resolution and, after the quiet period, the restore go in its thread."""
    from specguard.sim.slack_api import TOKEN, running

    async with running() as slack:
        (tmp_path / "router").mkdir()
        (tmp_path / "slack-token").write_text(TOKEN)
        config = CONFIG + (
            "  oncall:\n    type: slack\n    token: {file: slack-token}\n    channel: C0ONCALL\n"
            f"    base_url: {slack.url}\n    group_wait: 300ms\n"
        )
        (tmp_path / "specguard.yaml").write_text(config)
        (tmp_path / "rules.yaml").write_text(RULES.replace("[fallback, log]", "[fallback, oncall, log]"))
        loaded = load(tmp_path / "specguard.yaml")
        assert loaded.ok, loaded.problems
        daemon = Daemon(loaded, tmp_path / "specguard.yaml")
        source = Readings(0.2)
        daemon.source = source
        await daemon.start(handle_signals=False)
        try:
            await until("the firing is posted", lambda: len(slack.posted()) == 1)
            parent = slack.posted()[0]
            assert parent["blocks"][0]["text"]["text"] == "FIRING · CRITICAL · acceptance_critical"
            assert "*fallback* at" in json.dumps(
                parent["blocks"]
            ) and "fallback engaged: wrote" in json.dumps(parent["blocks"])
            source.value = 0.8
            await until("the restore is told", lambda: len(slack.posted()) == 3)
            replies = [m["text"] for m in slack.posted()[1:]]
            assert all(m["thread_ts"] == parent["ts"] for m in slack.posted()[1:])
            assert replies[0].startswith("Resolved at ")
            assert replies[1].startswith("fallback (restore): ok: speculative decoding restored after")
            assert parent["blocks"][0]["text"]["text"] == "RESOLVED · CRITICAL · acceptance_critical"
            # what the log action did is not news: only the world-changing action's outcomes are told
            assert "*log*" not in json.dumps(parent["blocks"])
            await asyncio.sleep(0.5)
            assert len(slack.posted()) == 3
            assert flag(tmp_path) == {"speculative": True}
        finally:
            await daemon.shutdown()
