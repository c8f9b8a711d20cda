"""A weekly report posted through the slack action's outbox, against the loopback Slack Web API
(Slack's external upload: an upload URL, the bytes, the completion): the summary once, each chart in its thread with
the very bytes of the PNG, every failure retried without a double, a missing chart skipped, and an
incoming webhook getting the summary alone."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from specguard.actions.slack import SlackAction, SlackParams
from specguard.report.slack import summary
from specguard.sim.slack_api import TOKEN, Fault, SlackApi
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

REPORT: dict[str, Any] = {
    "specguard_report": 1,
    "generated_at": "2026-12-07T08:00:00Z",
    "host": "gpu-07",
    "period": {"from": "2026-11-30T00:00:00Z", "to": "2026-12-07T00:00:00Z", "seconds": 604800},
    "previous_period": {"from": "2026-11-23T00:00:00Z", "to": "2026-11-30T00:00:00Z"},
    "series": [
        {
            "instance": "10.0.0.7:8000",
            "model": "llama-70b",
            "k": 5,
            "headline": {
                "acceptance_rate": {"value": 0.62, "previous": 0.65, "change": -0.046},
                "mean_acceptance_length": {"value": 3.1, "previous": 3.04, "change": 0.0197},
                "estimated_speedup": {"value": 2.4, "previous": None, "change": None},
                "e2e_latency_p95": {"value": 1.23, "previous": 1.19, "change": 0.0336},
            },
            "latency": [{"signal": "e2e_latency_p95", "value": 1.23, "baseline": 1.1, "ratio": 1.118}],
        }
    ],
    "rules": [
        {"rule": "acceptance_fallback", "severity": "critical", "fired": 2, "resolved": 2},
        {"rule": "acceptance_warning", "severity": "warning", "fired": 1, "resolved": 1},
    ],
    "fallbacks": {"count": 1, "seconds": 5400.0, "spans": []},
    "recommendations": [
        {"kind": "num_speculative_tokens", "title": f"llama-70b: try num_speculative_tokens={n}"}
        for n in range(3, 10)
    ],
    "charts": {"available": True, "missing": None},
}


def png(shade: int, width: int = 40, height: int = 30) -> bytes:
    """A valid grey PNG, different for each shade."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def charts(tmp_path: Path) -> list[tuple[str, str]]:
    """Two charts as the report writes them: (path, title)."""
    made = []
    for shade, (name, title) in enumerate(
        [
            ("acceptance-week.png", "Hourly acceptance, llama-70b"),
            ("latency.png", "Latency against the baseline"),
        ]
    ):
        path = tmp_path / name
        path.write_bytes(png(60 + 100 * shade))
        made.append((str(path), title))
    return made


def bot(api: SlackApi, tmp_path: Path) -> SlackAction:
    (tmp_path / "slack-token").write_text(TOKEN + "\n")
    raw = {
        "type": "slack",
        "token": {"file": str(tmp_path / "slack-token")},
        "channel": "C0REPORTS",
        "base_url": api.url,
        "group_wait": "0s",
        "request_timeout": "500ms",
        "backoff": "100ms",
        "max_backoff": "2s",  # also the longest Retry-After obeyed
    }
    return SlackAction("reports", SlackParams.model_validate(raw))


def memory(store: Store) -> StoreMemory:
    return StoreMemory(store, "reports")


async def deliver(action: SlackAction, store: Store, until: float = 10.0) -> None:
    """Tick the action until its outbox is empty (as the dispatcher's loop does)."""
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        due = await action.tick(memory(store))
        if due is None:
            return
        await asyncio.sleep(max(0.0, min(0.2, due - time.time())))
    raise AssertionError(f"the outbox was not emptied: {await memory(store).read('outbox')}")


def chart_messages(api: SlackApi) -> list[dict[str, Any]]:
    return [m for m in api.posted() if m.get("files")]


def summaries(api: SlackApi) -> list[dict[str, Any]]:
    return [m for m in api.posted() if not m.get("files")]


async def test_the_summary_is_posted_once_and_each_chart_uploaded_into_its_thread_byte_for_byte(
    slack: SlackApi, store: Store, tmp_path: Path, charts: list[tuple[str, str]]
) -> None:
    reports = bot(slack, tmp_path)
    text, blocks = summary(REPORT)
    said = await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    assert "report 2026-11-30: notice 1 (report) queued" in said
    assert "notice 3 (upload) queued" in said
    await deliver(reports, store)

    (posted,) = summaries(slack)
    assert posted["channel"] == "C0REPORTS" and posted["thread_ts"] is None
    assert posted["text"] == text and posted["blocks"] == blocks
    assert posted["metadata"] == {
        "event_type": "specguard_notice",
        "event_payload": {"notice": 1, "action": "reports", "report": "2026-11-30"},
    }
    in_thread = chart_messages(slack)
    assert [m["thread_ts"] for m in in_thread] == [posted["ts"], posted["ts"]]
    assert [m["files"][0]["title"] for m in in_thread] == [title for _, title in charts]
    shared = slack.shared()
    assert [(u.filename, u.title, u.channel, u.thread_ts) for u in shared] == [
        ("acceptance-week.png", "Hourly acceptance, llama-70b", "C0REPORTS", posted["ts"]),
        ("latency.png", "Latency against the baseline", "C0REPORTS", posted["ts"]),
    ]
    assert [u.data for u in shared] == [Path(path).read_bytes() for path, _ in charts]
    # the external upload: an upload URL, the bytes POSTed to it, the completion; no files.info
    assert [name for name, _, _ in slack.calls] == ["chat.postMessage"] + [
        "files.getUploadURLExternal",
        "upload",
        "files.completeUploadExternal",
    ] * 2

    record = (await memory(store).read("outbox"))["incidents"]["report|2026-11-30"]
    assert record["ts"] == posted["ts"] and record["posted_at"] is not None
    assert record["uploaded"] == ["acceptance-week.png", "latency.png"] and record["notes"] == []
    assert "blocks" not in record  # in Slack now: not kept in the store


async def test_queuing_the_same_report_again_posts_it_once(
    slack: SlackApi, store: Store, tmp_path: Path, charts: list[tuple[str, str]]
) -> None:
    reports = bot(slack, tmp_path)
    text, blocks = summary(REPORT)
    await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    again = await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    assert again == "report 2026-11-30 is already queued: not queued again"
    await deliver(reports, store)
    after = await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    assert after == "report 2026-11-30 is already posted: not queued again"
    await deliver(reports, store)
    assert len(summaries(slack)) == 1 and len(slack.shared()) == 2


@pytest.mark.parametrize(
    ("faults", "least_wait", "looks_first"),
    [
        # Retry-After is obeyed; a 429 surely shared nothing: no need to look in the thread
        ([Fault("429", 1.0, method="files.getUploadURLExternal")], 1.0, False),
        ([Fault("500", method="upload"), Fault("500", method="upload")], 0.1 + 0.2, True),  # doubling
        # the upload URL's 429: its Retry-After, and the file surely not shared yet: no look first
        ([Fault("429", 1.0, method="upload")], 1.0, False),
        ([Fault("500", method="files.completeUploadExternal")], 0.1, True),
        ([Fault("lose", method="files.completeUploadExternal")], 0.1, True),  # shared, the answer lost
    ],
    ids=["429-upload-url", "500-bytes", "429-bytes", "500-complete", "answer-lost-after-sharing"],
)
async def test_a_failed_upload_is_retried_and_the_chart_arrives_once(
    slack: SlackApi,
    store: Store,
    tmp_path: Path,
    charts: list[tuple[str, str]],
    faults: list[Fault],
    least_wait: float,
    looks_first: bool,
) -> None:
    reports = bot(slack, tmp_path)
    text, blocks = summary(REPORT)
    slack.faults = list(faults)
    await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts[:1])
    await deliver(reports, store)
    assert slack.faults == []  # every fault was met
    (chart,) = slack.shared()
    assert chart.data == Path(charts[0][0]).read_bytes() and chart.title == charts[0][1]
    assert len(chart_messages(slack)) == 1 and len(summaries(slack)) == 1
    names = [name for name, _, _ in slack.calls]
    assert ("conversations.replies" in names) is looks_first
    first_try = next(at for name, at, _ in slack.calls if name == "files.getUploadURLExternal")
    assert slack.calls[-1][1] - first_try >= least_wait


async def test_a_summary_whose_answer_was_lost_is_not_posted_again_and_gets_its_charts(
    slack: SlackApi, store: Store, tmp_path: Path, charts: list[tuple[str, str]]
) -> None:
    reports = bot(slack, tmp_path)
    text, blocks = summary(REPORT)
    slack.faults = [Fault("lose", method="chat.postMessage")]
    await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    await deliver(reports, store)
    (posted,) = summaries(slack)  # read back from the channel, by its metadata
    assert [name for name, _, _ in slack.calls][:2] == ["chat.postMessage", "conversations.history"]
    assert [m["thread_ts"] for m in chart_messages(slack)] == [posted["ts"], posted["ts"]]


async def test_a_chart_gone_before_its_turn_is_skipped_with_a_note_and_the_rest_delivered(
    slack: SlackApi,
    store: Store,
    tmp_path: Path,
    charts: list[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "specguard.action.slack")
    reports = bot(slack, tmp_path)
    text, blocks = summary(REPORT)
    await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    Path(charts[0][0]).unlink()
    await deliver(reports, store, until=3.0)  # not retried: the outbox empties
    assert [u.filename for u in slack.shared()] == ["latency.png"]
    state = await memory(store).read("outbox")
    assert state["items"] == []
    (note,) = state["incidents"]["report|2026-11-30"]["notes"]
    assert "acceptance-week.png" in note and "No such file" in note
    assert "skipped" in caplog.text and "acceptance-week.png" in caplog.text


async def test_an_incoming_webhook_gets_the_summary_alone(
    slack: SlackApi, store: Store, tmp_path: Path, charts: list[tuple[str, str]]
) -> None:
    (tmp_path / "hook").write_text(slack.webhook_url)
    raw = {"type": "slack", "webhook_url": {"file": str(tmp_path / "hook")}, "backoff": "100ms"}
    reports = SlackAction("reports", SlackParams.model_validate(raw))
    text, blocks = summary(REPORT)
    slack.faults = [Fault("500", method="webhook")]  # retried, as the notices are
    said = await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)
    assert "2 chart(s) not attached: uploading files needs a bot token" in said
    assert "upload" not in said.replace("uploading", "")
    await deliver(reports, store)
    (sent,) = [m for m in slack.messages if m["via"] == "webhook"]
    assert sent["text"] == text and sent["blocks"] == blocks
    assert slack.uploads == {} and not [c for c in slack.calls if c[0].startswith("files.")]
    record = (await memory(store).read("outbox"))["incidents"]["report|2026-11-30"]
    assert record["posted_at"] is not None and "needs a bot token" in record["notes"][0]


async def test_a_report_and_an_incident_share_the_outbox_each_in_its_own_order(
    slack: SlackApi, store: Store, tmp_path: Path, charts: list[tuple[str, str]]
) -> None:
    from specguard.actions.base import ActionContext

    reports = bot(slack, tmp_path)
    text, blocks = summary(REPORT)
    slack.faults = [Fault("500", method="upload")]
    await reports.queue_report(memory(store), "2026-11-30", text, blocks, charts)

    def event(db: sqlite3.Connection) -> int:
        with db:
            return int(
                db.execute(
                    "INSERT INTO events (at, rule, series, labels, kind, previous, severity, summary, "
                    "annotations, shadow, dry_run) VALUES (?, 'acceptance_critical', 's', '{}', 'firing', "
                    "'ok', 'critical', '', '{}', 0, 0)",
                    (time.time(),),
                ).lastrowid
                or 0
            )

    event_id = await store.call(event)
    firing = ActionContext(
        rule="acceptance_critical",
        event="firing",
        severity="critical",
        labels={"instance": "10.0.0.7:8000"},
        value=0.3,
        threshold=0.4,
        summary="acceptance 0.3 under 0.4",
        event_id=event_id,
        series="s",
        at=time.time(),
        memory=memory(store),
    )
    assert (await reports.run(firing)).ok
    await deliver(reports, store)
    messages = summaries(slack)
    assert {m["metadata"]["event_payload"]["notice"] for m in messages} == {1, 4}
    assert [m["thread_ts"] for m in messages] == [None, None]  # the incident is not in the report's thread
    assert [u.filename for u in slack.shared()] == ["acceptance-week.png", "latency.png"]
    # history hears of the incident's notice; the report has no event to note it under
    notes = await store.call(lambda db: db.execute("SELECT event_id, text FROM action_notes").fetchall())
    assert [(noted, text[:20]) for noted, text in notes] == [(event_id, "notice 4 posted to C")]


def test_a_huge_report_is_cut_to_slacks_limits_not_refused() -> None:
    series = [
        {"instance": f"10.0.0.{n}:8000", "model": "m" * 4000, "k": 5, "headline": {}} for n in range(80)
    ]
    huge = {**REPORT, "host": "h" * 400, "series": series, "recommendations": [{"title": "r" * 5000}] * 12}
    text, blocks = summary(huge)
    assert len(blocks) <= 50 and len(text) <= 3000
    assert len(blocks[0]["text"]["text"]) <= 150
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section"]
    assert all(len(s) <= 3000 for s in sections)
    assert any(s.startswith("…and ") and "more series" in s for s in sections)
    assert all(
        "E2E latency p95: *\u2013*" in s for s in sections[:-3]
    )  # a long name does not push out the figures
    assert "…and 7 more" in sections[-1]


def test_the_summary_shows_each_figure_with_its_week_over_week_change_and_a_dash_when_missing() -> None:
    text, blocks = summary(REPORT)
    assert blocks[0]["text"]["text"] == "Weekly report · gpu-07 · 2026-11-30 to 2026-12-07"
    series = blocks[2]["text"]["text"]
    assert series.splitlines() == [
        "*llama-70b on 10.0.0.7:8000 (k=5)*",
        "Acceptance rate: *62.0%* · ↓ -4.6% w/w",
        "Mean acceptance length: *3.10* · ↑ +2.0% w/w",
        "Estimated speedup: *2.40\u00d7* · \u2013 w/w",
        "E2E latency p95: *1.23 s* vs baseline 1.10 s (↑ +11.8%) · ↑ +3.4% w/w",
    ]
    assert blocks[3]["text"]["text"] == (
        "*Fallbacks:* 1 (1 h 30 min in total)\n"
        "*Rules fired:* 3 (acceptance_fallback \u00d72, acceptance_warning \u00d71)"
    )
    recommendations = blocks[4]["text"]["text"].splitlines()
    assert recommendations[0] == "*Recommendations (7)*" and len(recommendations) == 7
    assert recommendations[-1] == "…and 2 more in the full report"
    assert text.startswith("Weekly report · gpu-07") and "rules fired: 3" in text
    empty_text, empty = summary({})
    assert empty_text.endswith("fallbacks: \u2013; rules fired: \u2013; recommendations: 0")
    assert empty[0]["text"]["text"] == "Weekly report · \u2013 · \u2013"
    assert "*Fallbacks:* \u2013" in [b["text"]["text"] for b in empty if b["type"] == "section"][1]
