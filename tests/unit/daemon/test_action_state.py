"""What each action says of itself (``Action.state``) in /api/status, and how much of its work is
failing on /metrics (``specguard_action_failing``): read from the store at start and whenever the
action's memory changes, an action's own bug shown rather than taking the status down."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

from specguard.actions.base import Action, ActionContext, ActionMemory, Outcome
from specguard.actions.feature_flag import STATE_KEY as FLAG_KEY
from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.log import LogAction, LogParams
from specguard.cli.status import print_view
from specguard.daemon import overview
from specguard.daemon.page import status_page
from specguard.daemon.statusview import build
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.store.database import Store
from specguard.store.memory import StoreMemory


class Outbox(Action):
    """A notifier whose memory holds its outbox; it says what is in it."""

    type = "outbox"

    async def run(self, ctx: ActionContext) -> Outcome:
        return Outcome(True, "queued")

    async def state(self, memory: ActionMemory) -> dict[str, Any]:
        box = await memory.read("box") or {}
        return {
            "backlog": box.get("backlog", 0),
            "failing": box.get("failed", 0),
            "last_error": box.get("error"),
        }


class Buggy(Outbox):
    async def state(self, memory: ActionMemory) -> dict[str, Any]:
        raise RuntimeError("boom")


def flag(tmp_path: Path) -> FeatureFlagAction:
    params = FeatureFlagParams.model_validate(
        {
            "type": "feature_flag",
            "file": {"path": str(tmp_path / "f.json"), "engage": {"s": False}, "restore": {"s": True}},
        }
    )
    return FeatureFlagAction("fallback", params)


def actions(tmp_path: Path) -> dict[str, Action]:
    return {
        "oncall": Outbox("oncall", LogParams(type="log")),
        "buggy": Buggy("buggy", LogParams(type="log")),
        "fallback": flag(tmp_path),
        "log": LogAction("log", LogParams(type="log")),
    }


async def test_the_status_shows_every_actions_state_and_a_flags_failures(
    store: Store, tmp_path: Path
) -> None:
    await StoreMemory(store, "oncall").update(
        "box", lambda _: {"backlog": 3, "failed": 1, "error": "invalid_auth"}
    )
    await StoreMemory(store, "fallback").update(
        FLAG_KEY, lambda _: {"state": "unknown", "failures": 2, "next_try": 123.0}
    )
    status = {"rules": [], "fallbacks": {}}
    doc = await overview.gather(status, (True, {}), store, actions(tmp_path), time.time(), time.time())
    assert doc["actions"] == {
        "buggy": {"type": "outbox", "state": "cannot be read: RuntimeError: boom"},
        "fallback": {"type": "feature_flag", "state": {}},
        "log": {"type": "log", "state": {}},
        "oncall": {"type": "outbox", "state": {"backlog": 3, "failing": 1, "last_error": "invalid_auth"}},
    }
    shown = doc["fallbacks"]["fallback"]
    assert (shown["is"], shown["failures"], shown["canary_failures"], shown["next_try"]) == (
        "unknown",
        2,
        0,
        123.0,
    )
    assert "read_error" not in doc["store"]


def failing(d: Dispatcher, action: str) -> float | None:
    return d.metrics.registry.get_sample_value("specguard_action_failing", {"action": action})


async def test_failing_work_is_a_gauge_per_action_kept_up_to_date(store: Store, tmp_path: Path) -> None:
    d = Dispatcher(store, actions(tmp_path), False, DaemonMetrics())
    await d.show_holdings()
    assert [failing(d, name) for name in ("oncall", "fallback", "log", "buggy")] == [0, 0, 0, None]
    await StoreMemory(store, "oncall").update("box", lambda _: {"failed": 2})
    await StoreMemory(store, "fallback").update(FLAG_KEY, lambda _: {"state": "unknown", "failures": 3})
    await d.show_holdings()
    assert (failing(d, "oncall"), failing(d, "fallback")) == (2, 3)
    d.actions = {"log": LogAction("log", LogParams(type="log"))}  # a reload: the others are gone
    await d.show_holdings(["oncall", "fallback"])
    assert (failing(d, "oncall"), failing(d, "fallback"), failing(d, "log")) == (None, None, 0)


async def test_the_page_and_the_text_show_what_an_action_says(store: Store, tmp_path: Path) -> None:
    await StoreMemory(store, "oncall").update(
        "box", lambda _: {"backlog": 2, "failed": 1, "error": "chat.postMessage: <channel_not_found>"}
    )
    now = time.time()
    doc = await overview.gather({"rules": [], "now": now}, (True, {}), store, actions(tmp_path), now, now)
    view = build(doc)
    html = status_page(view)
    assert '<section id="actions">' in html
    assert "2 waiting, 1 failing; last error: chat.postMessage: &lt;channel_not_found&gt;" in html
    assert "action oncall is failing: 2 waiting, 1 failing" in html  # among the problems at the top
    out = io.StringIO()
    print_view(view, "http://127.0.0.1:9464", out)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(": degraded, none firing")
    (row,) = [line for line in lines[lines.index("Actions") :] if line.split()[:1] == ["oncall"]]
    assert row.split()[:2] == ["oncall", "outbox"] and row.endswith(
        "last error: chat.postMessage: <channel_not_found>"
    )
