"""The slack action against a Slack Web API on loopback (the action's base_url points at it): one
thread per incident, the parent edited when resolved, grouping, every failure mode, and a restart
in the middle of an outage: nothing lost, nothing doubled."""

from __future__ import annotations

import json
import logging
import re
import time
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


def action(api: SlackApi, tmp_path: Path, **extra: Any) -> SlackAction:
    (tmp_path / "slack-token").write_text(TOKEN + "\n")
    raw = {
        "type": "slack",
        "token": {"file": str(tmp_path / "slack-token")},
        "channel": "C0ONCALL",
        "base_url": api.url,
        "group_wait": "200ms",
        "request_timeout": "500ms",
        "backoff": "100ms",
        "max_backoff": "400ms",
        "host": "gpu-node-7",
        **extra,
    }
    return SlackAction("oncall", SlackParams.model_validate(raw))


def ctx(store: Store, event: str, at: float, event_id: int = 1, **extra: Any) -> ActionContext:
    return ActionContext(
        rule="acceptance_critical",
        event=event,
        severity="critical",
        labels=LABELS,
        value=0.31 if event == "firing" else 0.72,
        threshold=0.4,
        summary="acceptance 0.31 under 0.4 on vllm-a:8000"
        if event == "firing"
        else "acceptance back at 0.72",
        annotations={
            "runbook_url": "https://runbooks.example/spec-decode",
            "dashboard_url": "https://grafana.example/d/spec",
        },
        event_id=event_id,
        series=SERIES,
        at=at,
        memory=StoreMemory(store, "oncall"),
        **extra,
    )


def texts(blocks: list[dict[str, Any]]) -> str:
    out = []
    for block in blocks:
        if "text" in block:
            out.append(block["text"]["text"])
        out.extend(f["text"] for f in block.get("fields", []))
        out.extend(e["text"] for e in block.get("elements", []))
    return "\n".join(out)


async def test_an_incident_is_one_thread_and_its_parent_shows_the_resolution(
    slack: SlackApi, store: Store, tmp_path: Path
) -> None:
    oncall = action(slack, tmp_path)
    fired = time.time()
    fallback = RunOutcome(
        "acceptance_critical",
        SERIES,
        "firing",
        "fallback",
        "run",
        "ok",
        "fallback engaged: wrote /etc/router/speculative.json",
        fired + 1,
    )
    outcome = await oncall.run(ctx(store, "firing", fired, outcomes=(fallback,)))
    assert outcome.ok and "notice 1 (post) queued" in outcome.detail
    assert slack.posted() == []  # the group wait first
    await deliver(oncall, store)
    (parent,) = slack.posted()
    assert parent["channel"] == "C0ONCALL" and parent["thread_ts"] is None
    assert parent["metadata"] == {
        "event_type": "specguard_notice",
        "event_payload": {"notice": 1, "action": "oncall"},
    }
    shown = texts(parent["blocks"])
    assert parent["blocks"][0]["text"]["text"] == "FIRING · CRITICAL · acceptance_critical"
    for expected in ("gpu-node-7", "llama-8b", "0.31 (threshold 0.4)", "*fallback* at", "(1 s after firing)",
                     "<https://runbooks.example/spec-decode|Runbook>", "<https://grafana.example/d/spec|Dashboard>"):  # fmt: skip
        assert expected in shown, (expected, shown)
    assert parent["text"].startswith("[FIRING] CRITICAL acceptance_critical on instance=vllm-a:8000")

    # the restore after the quiet period: a reply in the thread, the parent edited with it
    await oncall.observe(
        RunOutcome("acceptance_critical", SERIES, "resolved", "fallback", "restore", "ok", "speculative decoding restored", time.time()),
        StoreMemory(store, "oncall"),
    )  # fmt: skip
    assert (await oncall.run(ctx(store, "resolved", time.time()))).ok
    await deliver(oncall, store)
    replies = [m for m in slack.posted() if m["thread_ts"] == parent["ts"]]
    assert [r["text"] for r in replies][:1] == ["fallback (restore): ok: speculative decoding restored"]
    assert len(replies) == 2
    # the resolution says the rule's words for it, not the firing's (worded for the breach)
    assert re.fullmatch(r"Resolved at \d\d:\d\d:\d\d UTC: acceptance back at 0\.72", replies[1]["text"])
    assert (
        parent["edits"] == 2
        and parent["blocks"][0]["text"]["text"] == "RESOLVED · CRITICAL · acceptance_critical"
    )
    assert "Resolved at" in texts(parent["blocks"])
    # the edited parent leads with the resolution's words; the firing's stay, marked as such
    assert parent["blocks"][1]["text"]["text"] == (
        ":white_check_mark: acceptance back at 0.72\nFired: acceptance 0.31 under 0.4 on vllm-a:8000"
    )
    assert len(slack.posted()) == 3

    # a world-changing action that failed later (a restart rolled back) stands out in the thread
    await oncall.observe(
        RunOutcome("acceptance_critical", SERIES, "firing", "shrink", "run", "failed", "k 3 -> 1 failed at verify; rolled back to k=3", time.time()),
        StoreMemory(store, "oncall"),
    )  # fmt: skip
    await deliver(oncall, store)
    last = [m for m in slack.posted() if m["thread_ts"] == parent["ts"]][-1]
    assert last["text"] == ":rotating_light: shrink FAILED: k 3 -> 1 failed at verify; rolled back to k=3"

    # one that pages without failing (a restart deferred with the fleet's store down; a step done
    # after its fleet slot had ended) stands out too; one that neither fails nor pages does not
    for status, detail, page in (("deferred", "deferred: the fleet's redis cannot be reached", True),
                                 ("ok", "k 3 -> 1: ...; done without a fleet slot", True),
                                 ("ok", "k 3 -> 1: verified", False)):  # fmt: skip
        await oncall.observe(
            RunOutcome(
                "acceptance_critical", SERIES, "firing", "shrink", "run", status, detail, time.time(), page
            ),
            StoreMemory(store, "oncall"),
        )
    await deliver(oncall, store)
    assert [m["text"] for m in slack.posted() if m["thread_ts"] == parent["ts"]][-3:] == [
        ":rotating_light: shrink: deferred: the fleet's redis cannot be reached",
        ":rotating_light: shrink: ok: k 3 -> 1: ...; done without a fleet slot",
        "shrink: ok: k 3 -> 1: verified",
    ]


async def test_a_firing_resolved_within_the_group_wait_is_one_message(
    slack: SlackApi, store: Store, tmp_path: Path
) -> None:
    oncall = action(slack, tmp_path, group_wait="1s")
    now = time.time()
    await oncall.run(ctx(store, "firing", now))
    said = await oncall.run(ctx(store, "resolved", now + 0.1))
    assert "one message says both" in said.detail
    await deliver(oncall, store)
    (only,) = slack.posted()
    assert only["blocks"][0]["text"]["text"].startswith("RESOLVED")


@pytest.mark.parametrize(
    ("faults", "least_wait"),
    [
        ([Fault("429", 1.0)], 1.0),  # Retry-After is obeyed
        ([Fault("500"), Fault("500")], 0.1 + 0.2),  # doubling backoff
        ([Fault("drop")], 0.1),
        ([Fault("slow", 2.0)], 0.1),  # longer than request_timeout: a timeout
    ],
    ids=["429", "5xx", "connection-dropped", "timeout"],
)
async def test_every_failure_is_retried_until_delivered_once(
    slack: SlackApi, store: Store, tmp_path: Path, faults: list[Fault], least_wait: float
) -> None:
    oncall = action(slack, tmp_path, group_wait="0s", max_backoff="2s")  # Retry-After up to 2s
    slack.faults = list(faults)
    await oncall.run(ctx(store, "firing", time.time()))
    await deliver(oncall, store)
    assert len(slack.posted()) == 1
    attempts = [at for _, at, _ in slack.calls]  # after an unclear failure, a look at the channel first
    assert len(attempts) >= len(faults) + 1
    assert attempts[-1] - attempts[0] >= least_wait  # recorded times of the attempts


async def test_a_post_whose_answer_was_lost_is_not_posted_again(
    slack: SlackApi, store: Store, tmp_path: Path
) -> None:
    oncall = action(slack, tmp_path, group_wait="0s")
    slack.faults = [Fault("lose")]
    await oncall.run(ctx(store, "firing", time.time()))
    await deliver(oncall, store)
    assert len(slack.posted()) == 1  # read back from the channel, by its metadata
    assert [name for name, _, _ in slack.calls] == ["chat.postMessage", "conversations.history"]
    # and the thread is known: the resolution goes in it
    await oncall.run(ctx(store, "resolved", time.time()))
    await deliver(oncall, store)
    assert slack.posted()[1]["thread_ts"] == slack.posted()[0]["ts"]


async def test_a_restart_in_an_outage_loses_nothing_and_doubles_nothing(
    slack: SlackApi, tmp_path: Path
) -> None:
    path = tmp_path / "specguard.db"
    store = Store(path)
    await store.open()
    first = action(slack, tmp_path, group_wait="0s")
    slack.faults = [Fault("500")] * 6
    now = time.time()
    for number in range(3):  # three incidents while Slack is down
        await first.run(ctx(store, "firing", now, event_id=number + 1))
    await first.tick(StoreMemory(store, "oncall"))  # every one tried once, and failed
    pending = (await StoreMemory(store, "oncall").read("outbox"))["items"]
    assert [(item["id"], item["attempts"], item["sending"]) for item in pending] == [
        (1, 1, True),
        (2, 1, True),
        (3, 1, True),
    ]
    await store.close()  # the daemon stops (or is killed) with the outbox full

    slack.faults = []  # Slack is back
    store = Store(path)
    await store.open()
    try:
        second = action(slack, tmp_path, group_wait="0s")
        await deliver(second, store)
        notices = [m["metadata"]["event_payload"]["notice"] for m in slack.posted()]
        assert notices == [1, 2, 3]  # each once, in order
    finally:
        await store.close()


async def test_an_incoming_webhook_gets_each_notice_as_a_message(
    slack: SlackApi, store: Store, tmp_path: Path
) -> None:
    (tmp_path / "hook").write_text(slack.webhook_url)
    raw = {
        "type": "slack",
        "webhook_url": {"file": str(tmp_path / "hook")},
        "group_wait": "0s",
        "backoff": "100ms",
    }
    oncall = SlackAction("oncall", SlackParams.model_validate(raw))
    slack.faults = [Fault("500")]
    await oncall.run(ctx(store, "firing", time.time()))
    await deliver(oncall, store)
    await oncall.run(ctx(store, "resolved", time.time()))
    await deliver(oncall, store)
    sent = [m for m in slack.messages if m["via"] == "webhook"]
    assert [m["text"][:9] for m in sent] == ["[FIRING] ", "acceptanc"]
    assert sent[1]["text"].startswith("acceptance_critical: Resolved at")


def test_bad_slack_configuration_says_what_is_wrong(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValidationError, match="give `token`"):
        SlackParams.model_validate({"type": "slack", "channel": "C0ONCALL"})
    with pytest.raises(ValidationError, match="give the channel's id"):
        SlackParams.model_validate(
            {"type": "slack", "token": {"env": "SLACK_TOKEN"}, "channel": "#ml-oncall"}
        )
    with pytest.raises(ValidationError, match="needs the `channel`"):
        SlackParams.model_validate({"type": "slack", "token": {"env": "SLACK_TOKEN"}})
    (tmp_path / "hook").write_text("http://hooks.slack.com/services/x")
    params = SlackParams.model_validate({"type": "slack", "webhook_url": {"file": str(tmp_path / "hook")}})
    with pytest.raises(ValueError, match="give an https:// URL"):
        SlackAction("oncall", params)
    params = SlackParams.model_validate(
        {"type": "slack", "token": {"env": "NO_SUCH_VARIABLE_X"}, "channel": "C0ONCALL"}
    )
    with pytest.raises(
        ValueError, match=r"actions.oncall.token: environment variable NO_SUCH_VARIABLE_X is not set"
    ):
        SlackAction("oncall", params)


async def test_the_token_is_never_logged(
    slack: SlackApi, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    oncall = action(slack, tmp_path, group_wait="0s")
    slack.faults = [Fault("500")]
    await oncall.run(ctx(store, "firing", time.time()))
    await deliver(oncall, store)
    assert TOKEN not in caplog.text
    assert TOKEN not in json.dumps(await StoreMemory(store, "oncall").read("outbox"))
