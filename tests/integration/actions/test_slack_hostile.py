"""The slack action against a Slack that misbehaves (the loopback Web API and webhook of
sim/slack_api.py): a Retry-After that is infinite, huge or an HTTP date; an outbox row an older
version left with an infinite due time; answers of 800 MB; errors that no retry mends; an ``ok``
that does not say where the message went. The notice is never lost, never waits forever, memory
stays bounded, and ``state`` says what is going on."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specguard.actions.base import ActionContext
from specguard.actions.slack import SlackAction, SlackParams
from specguard.sim.slack_api import TOKEN, Fault, SlackApi
from specguard.store.database import Store
from specguard.store.memory import StoreMemory
from specguard.store.records import RunOutcome
from tests.slack_outbox import deliver

LABELS = {"instance": "vllm-a:8000", "model_name": "llama-8b"}
SERIES = json.dumps(LABELS, sort_keys=True)
HUGE = 800 * 1024 * 1024


def action(api: SlackApi, tmp_path: Path, webhook: bool = False, **extra: Any) -> SlackAction:
    if webhook:
        (tmp_path / "hook").write_text(api.webhook_url)
        way: dict[str, Any] = {"webhook_url": {"file": str(tmp_path / "hook")}}
    else:
        (tmp_path / "slack-token").write_text(TOKEN + "\n")
        way = {"token": {"file": str(tmp_path / "slack-token")}, "channel": "C0ONCALL", "base_url": api.url}
    raw = {
        "type": "slack",
        **way,
        "group_wait": "0s",
        "request_timeout": "5s",
        "backoff": "100ms",
        "max_backoff": "400ms",
        **extra,
    }
    return SlackAction("oncall", SlackParams.model_validate(raw))


def ctx(store: Store, event: str, event_id: int = 1) -> ActionContext:
    return ActionContext(
        rule="acceptance_critical",
        event=event,
        severity="critical",
        labels=LABELS,
        value=0.31,
        threshold=0.4,
        summary=f"acceptance {event}",
        event_id=event_id,
        series=SERIES,
        at=time.time(),
        memory=StoreMemory(store, "oncall"),
    )


async def outbox(store: Store) -> dict[str, Any]:
    value: dict[str, Any] = await StoreMemory(store, "oncall").read("outbox")
    return value


def sent(api: SlackApi, webhook: bool) -> list[dict[str, Any]]:
    return [m for m in api.messages if m["via"] == ("webhook" if webhook else "api")]


# --- Retry-After --------------------------------------------------------------------------------


@pytest.mark.parametrize("webhook", [False, True], ids=["web-api", "webhook"])
@pytest.mark.parametrize(
    ("header", "least", "most"),
    [
        ("inf", 0.1, 0.1),  # refused: the own backoff (100ms)
        ("999999999", 3.0, 3.0),  # capped at max_backoff (3s)
        ("date", 1.0, 2.0),  # an HTTP date 2s ahead, in whole seconds (and a second at least)
    ],
    ids=["inf", "huge", "http-date"],
)
async def test_retry_after_is_read_finite_and_capped_at_max_backoff(
    slack: SlackApi, store: Store, tmp_path: Path, webhook: bool, header: str, least: float, most: float
) -> None:
    oncall = action(slack, tmp_path, webhook=webhook, max_backoff="3s")
    value = formatdate(time.time() + 2, usegmt=True) if header == "date" else header
    slack.faults = [Fault("429", retry_after=value, method="webhook" if webhook else "chat.postMessage")]
    await oncall.run(ctx(store, "firing"))
    before = time.time()
    await oncall.tick(StoreMemory(store, "oncall"))
    after = time.time()
    (item,) = (await outbox(store))["items"]
    assert item["attempts"] == 1 and math.isfinite(item["due"])
    # due: the time of the 429 (between before and after) plus the wait
    assert before + least - 0.01 <= item["due"] <= after + most + 0.01, (value, item["due"] - before)
    await deliver(oncall, store, until=30.0)
    assert len(sent(slack, webhook)) == 1


@pytest.mark.parametrize("stored", [math.inf, math.nan], ids=["Infinity", "NaN"])
async def test_a_notice_stored_due_at_infinity_is_delivered_after_a_restart(
    slack: SlackApi, tmp_path: Path, stored: float
) -> None:
    path = tmp_path / "specguard.db"
    store = Store(path)
    await store.open()
    first = action(slack, tmp_path)
    await first.run(ctx(store, "firing"))
    await deliver(first, store, until=30.0)
    await first.observe(  # news of the incident: a reply, then the parent's edit, behind it
        RunOutcome("acceptance_critical", SERIES, "firing", "fallback", "run", "ok", "fallback engaged", time.time()),
        StoreMemory(store, "oncall"),
    )  # fmt: skip

    def poisoned(state: dict[str, Any]) -> dict[str, Any]:  # as an older version stored a `Retry-After: inf`
        assert [i["kind"] for i in state["items"]] == ["reply", "update"]
        state["items"][0].update(due=stored, attempts=1, error="429 rate limited")
        return state

    await StoreMemory(store, "oncall").update("outbox", poisoned)
    assert "Infinity" in json.dumps(await outbox(store)) or "NaN" in json.dumps(await outbox(store))
    await store.close()

    store = Store(path)  # the daemon restarts
    await store.open()
    try:
        second = action(slack, tmp_path)
        await deliver(second, store, until=15.0)
        parent, reply = slack.posted()
        assert reply["thread_ts"] == parent["ts"] and reply["text"] == "fallback: ok: fallback engaged"
        assert parent["edits"] == 1
        assert "Infinity" not in json.dumps(await outbox(store)) and "NaN" not in json.dumps(
            await outbox(store)
        )
    finally:
        await store.close()


# --- answers of any size ------------------------------------------------------------------------


class PeakRss:
    """The process's peak resident memory from now on (Linux: VmHWM, reset through clear_refs;
    where that cannot be reset, sampled by a thread)."""

    def __init__(self) -> None:
        self.start = self._rss()
        self._peak = self.start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._hwm = True
        except OSError:
            self._hwm = False
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    @staticmethod
    def _field(name: str) -> int:
        found = re.search(rf"^{name}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
        assert found is not None
        return int(found.group(1)) * 1024

    def _rss(self) -> int:
        return self._field("VmRSS")

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._peak = max(self._peak, self._rss())

    def growth(self) -> int:
        if self._hwm:
            return self._field("VmHWM") - self.start
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        return self._peak - self.start


@pytest.mark.parametrize(
    ("webhook", "chunked"),
    [(False, False), (False, True), (True, True)],
    ids=["web-api-declared", "web-api-chunked", "webhook-chunked"],
)
async def test_an_800_mb_answer_fails_the_attempt_and_memory_stays_bounded(
    slack: SlackApi, store: Store, tmp_path: Path, webhook: bool, chunked: bool
) -> None:
    oncall = action(slack, tmp_path, webhook=webhook)
    method = "webhook" if webhook else "chat.postMessage"
    slack.faults = [Fault("huge", size=HUGE, chunked=chunked, method=method)]
    await oncall.run(ctx(store, "firing"))
    peak = PeakRss()
    await asyncio.wait_for(oncall.tick(StoreMemory(store, "oncall")), 120)  # a hang guard
    growth = peak.growth()
    (item,) = (await outbox(store))["items"]
    assert item["attempts"] == 1
    assert "max_response_size 1 MiB" in item["error"], item["error"]
    assert growth < 50 * 1024 * 1024, f"{growth / 2**20:.0f} MiB more at the peak"
    state = await oncall.state(StoreMemory(store, "oncall"))
    assert state["backlog"] == 1 and "max_response_size" in state["last_error"]
    await deliver(oncall, store, until=30.0)
    if webhook:  # a webhook cannot be read back: at least once
        assert len(sent(slack, webhook)) >= 1
    else:  # the huge answer came after the post was done: found by its metadata, not posted again
        assert len(slack.posted()) == 1


# --- errors that no retry mends -----------------------------------------------------------------

PERMANENT = [
    Fault("error", error=code, method="chat.postMessage")
    for code in ("invalid_auth", "not_in_channel", "channel_not_found", "account_inactive", "token_revoked",
                 "is_archived")
] + [Fault("status", status=status, error="nope", method="chat.postMessage") for status in (400, 403, 404)]  # fmt: skip


@pytest.mark.parametrize(
    "fault", PERMANENT, ids=[f.error if f.kind == "error" else str(f.status) for f in PERMANENT]
)
async def test_a_permanent_error_fails_the_notice_for_good_and_says_so_once(
    slack: SlackApi, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: Fault
) -> None:
    caplog.set_level(logging.INFO, "specguard.action.slack")
    oncall = action(slack, tmp_path)
    slack.faults = [fault]
    await oncall.run(ctx(store, "firing"))
    memory = StoreMemory(store, "oncall")
    assert await oncall.tick(memory) is None  # nothing left to try
    assert [name for name, _, _ in slack.calls] == ["chat.postMessage"]  # tried once, not again
    reason = fault.error if fault.kind == "error" else f"{fault.status} nope"
    (failed,) = (await outbox(store))["failed"]
    assert failed["id"] == 1 and failed["kind"] == "post" and reason in failed["error"]
    state = await oncall.state(memory)
    assert state["backlog"] == 0 and state["failing"] == 1 and state["next_try"] is None
    assert reason in state["last_error"] and abs(state["last_error_at"] - time.time()) < 60
    json.dumps(state)  # JSON values, for /api/status
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "failed for good" in errors[0].getMessage()

    # its incident's later notices have no thread to go in: failed too, never sent to channel None
    await oncall.run(ctx(store, "resolved"))
    await deliver(oncall, store, until=30.0)
    assert [name for name, _, _ in slack.calls] == ["chat.postMessage"]
    assert (await oncall.state(memory))["failing"] == 3
    # and the next incident is not held up by them
    await oncall.run(ctx(store, "firing", event_id=2))
    await deliver(oncall, store, until=30.0)
    (posted,) = slack.posted()
    assert posted["metadata"]["event_payload"]["notice"] == 4
    # Slack takes notices again: nothing is failing now, and the three failed are still counted
    state = await oncall.state(memory)
    assert (state["failing"], state["failed"]) == (0, 3), state


@pytest.mark.parametrize(
    "fault",
    [Fault("status", status=404, error="channel_not_found", method="webhook"),
     Fault("status", status=403, error="action_prohibited", method="webhook")],
    ids=["404", "403"],
)  # fmt: skip
async def test_a_webhook_4xx_fails_the_notice_for_good(
    slack: SlackApi, store: Store, tmp_path: Path, fault: Fault
) -> None:
    oncall = action(slack, tmp_path, webhook=True)
    slack.faults = [fault]
    await oncall.run(ctx(store, "firing"))
    memory = StoreMemory(store, "oncall")
    assert await oncall.tick(memory) is None  # nothing left to try
    assert slack.messages == []
    state = await oncall.state(memory)
    assert state["failing"] == 1 and state["backlog"] == 0
    assert f"the webhook: {fault.status} {fault.error}" in state["last_error"]


@pytest.mark.parametrize(
    "fault",
    [Fault("status", status=408, error="timeout"), Fault("error", error="internal_error"), Fault("429", 0.0)],
    ids=["408", "internal_error", "429"],
)
async def test_errors_that_waiting_may_mend_are_retried(
    slack: SlackApi, store: Store, tmp_path: Path, fault: Fault
) -> None:
    oncall = action(slack, tmp_path)
    slack.faults = [fault]
    await oncall.run(ctx(store, "firing"))
    memory = StoreMemory(store, "oncall")
    tried = time.time()
    await oncall.tick(memory)
    state = await oncall.state(memory)
    # a retry planned after the failed try (its wait may be short: how long the tick took on a
    # loaded machine says nothing about it)
    assert state["backlog"] == 1 and state["failing"] == 0 and state["next_try"] >= tried
    await deliver(oncall, store, until=30.0)
    assert len(slack.posted()) == 1
    assert (await oncall.state(memory))["backlog"] == 0


@pytest.mark.parametrize(
    "answer", [{"ok": True}, {"ok": True, "channel": None, "ts": None}], ids=["missing", "null"]
)
async def test_ok_without_channel_and_ts_is_not_a_delivery(
    slack: SlackApi, store: Store, tmp_path: Path, answer: dict[str, Any]
) -> None:
    oncall = action(slack, tmp_path)
    slack.faults = [Fault("answer", answer=answer, method="chat.postMessage")]  # posted, but said so
    await oncall.run(ctx(store, "firing"))
    memory = StoreMemory(store, "oncall")
    await oncall.tick(memory)
    state = await oncall.state(memory)
    assert state["backlog"] == 1 and "no channel and ts" in state["last_error"]
    await deliver(oncall, store, until=30.0)
    (parent,) = slack.posted()  # found by its metadata on the next try: not posted again
    incident = next(iter((await outbox(store))["incidents"].values()))
    assert (incident["channel"], incident["ts"]) == ("C0ONCALL", parent["ts"])
    await oncall.run(ctx(store, "resolved"))
    await deliver(oncall, store, until=30.0)
    assert [m["channel"] for m in slack.posted()] == ["C0ONCALL", "C0ONCALL"]
    assert slack.posted()[1]["thread_ts"] == parent["ts"] and parent["edits"] == 1


# --- configuration ------------------------------------------------------------------------------


def test_bad_limits_say_what_is_wrong(tmp_path: Path) -> None:
    base = {"type": "slack", "token": {"env": "SLACK_TOKEN"}, "channel": "C0ONCALL"}
    assert SlackParams.model_validate(base).max_response_size == 1024 * 1024
    assert SlackParams.model_validate({**base, "max_response_size": "64KiB"}).max_response_size == 65536
    with pytest.raises(ValidationError, match="max_response_size"):
        SlackParams.model_validate({**base, "max_response_size": "lots"})
    with pytest.raises(ValidationError, match="max_response_size"):
        SlackParams.model_validate({**base, "max_response_size": 0})
    with pytest.raises(ValidationError, match=r"max_backoff \(1s\) is shorter than backoff \(5s\)"):
        SlackParams.model_validate({**base, "max_backoff": "1s"})
    with pytest.raises(ValidationError, match="max_backoff"):
        SlackParams.model_validate({**base, "max_backoff": "forever"})
