"""What a delivery does beyond posting a message: looking in the channel for a notice (or a
chart) that a try whose answer was lost may have posted, and uploading a chart into a report's
thread."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from specguard.actions.slack.web import Retry, Skipped, Slack

log = logging.getLogger("specguard.action.slack")

EVENT_TYPE = "specguard_notice"  # the metadata's event_type of every message the action posts


def posted(incident: dict[str, Any]) -> bool:
    """Whether the incident's (or report's) first message is known in Slack: its channel and ts."""
    channel, ts = incident.get("channel"), incident.get("ts")
    return isinstance(channel, str) and bool(channel) and isinstance(ts, str) and bool(ts)


def dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a list from an answer (anything else in it, or no list, is ignored)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


async def find(
    slack: Slack, action: str, item: dict[str, Any], channel: str, thread: str | None
) -> tuple[str, str] | None:
    """The notice, if an earlier attempt did post it (its metadata says so)."""
    query = {"channel": channel, "oldest": f"{item['created'] - 5:.6f}", "include_all_metadata": "true",
             "limit": "200"}  # fmt: skip
    if thread is None:
        answer = await slack.call("conversations.history", query=query)
    else:
        answer = await slack.call("conversations.replies", query={**query, "ts": thread})
    for found in dicts(answer.get("messages")):
        meta = _object(found.get("metadata"))
        payload = _object(meta.get("event_payload"))
        ts = found.get("ts")
        if (
            meta.get("event_type") == EVENT_TYPE
            and payload.get("notice") == item["id"]
            and payload.get("action") == action
            and isinstance(ts, str)
            and ts
        ):
            log.info("slack notice %d was posted before the answer was lost: not posted again", item["id"])
            return channel, ts
    return None


async def upload(slack: Slack, item: dict[str, Any], report: dict[str, Any]) -> None:
    """Upload a chart into the report's thread, unless an earlier try did.

    The file is read here, before anything is sent, so that a file gone (Skipped, for good) is
    told apart from Slack not answering (Retry). As Slack's external upload goes: ask
    ``files.getUploadURLExternal`` for an upload URL, POST the bytes to it, and share the file
    with ``files.completeUploadExternal``; a try that fails part way leaves an upload never
    completed, which Slack discards."""
    path = Path(item["path"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Skipped(
            f"chart {item['filename']} ({item['title']}) not uploaded: {path}: {exc.strerror or exc}"
        ) from None
    if not posted(report):
        raise Skipped(f"chart {item['filename']} not uploaded: the report's message is not known")
    if item.get("sending") and await _shared(slack, item, report):
        return
    got = await slack.call(
        "files.getUploadURLExternal", form={"filename": item["filename"], "length": str(len(data))}
    )
    file_id, url = got.get("file_id"), got.get("upload_url")
    if not (isinstance(file_id, str) and file_id and isinstance(url, str)):
        raise Retry("files.getUploadURLExternal: ok, but the answer gives no file_id and upload_url")
    await slack.upload(url, data)
    await slack.call(
        "files.completeUploadExternal",
        form={
            "files": json.dumps([{"id": file_id, "title": item["title"]}]),
            "channel_id": report["channel"],
            "thread_ts": report["ts"],
        },
    )


async def _shared(slack: Slack, item: dict[str, Any], report: dict[str, Any]) -> bool:
    """Whether the chart is in the report's thread already (a try whose answer was lost): a file
    carries no metadata, so it is known by its name and title, unique in the report."""
    answer = await slack.call(
        "conversations.replies",
        query={"channel": report["channel"], "ts": report["ts"], "oldest": f"{item['created'] - 5:.6f}",
               "limit": "200"},
    )  # fmt: skip
    for message in dicts(answer.get("messages")):
        for shared in dicts(message.get("files")):
            if shared.get("name") == item["filename"] and shared.get("title") == item["title"]:
                log.info(
                    "slack chart %s was uploaded before the answer was lost: not again", item["filename"]
                )
                return True
    return False
