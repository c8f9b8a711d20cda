"""A test message that shows the ``slack`` action reaches its channel: posted with
``chat.postMessage`` and deleted at once with ``chat.delete`` (a bot may delete its own messages
with the ``chat:write`` scope it posts with). An incoming webhook can post but neither read back
nor delete: its test message stays, and is worded so."""

from __future__ import annotations

from dataclasses import dataclass

from specguard.actions.slack.web import Failed, Retry, Slack


@dataclass(frozen=True)
class Probe:
    channel: str | None  # where it went (None: a webhook's channel, which it does not say)
    ts: str | None
    deleted: bool


async def post_and_delete(slack: Slack, channel: str | None, webhook: str | None, text: str) -> Probe:
    """Post ``text`` and delete it (through ``webhook`` when given: posted only). Raises the
    action's Retry or Failed with Slack's reason; ``Failed`` after a post means it was not deleted."""
    async with slack:
        if webhook is not None:
            await slack.webhook(webhook, {"text": f"{text} (an incoming webhook cannot delete it)"})
            return Probe(None, None, False)
        answer = await slack.call("chat.postMessage", json_body={"channel": channel or "", "text": text})
        posted_in, ts = answer.get("channel"), answer.get("ts")
        if not (isinstance(posted_in, str) and posted_in and isinstance(ts, str) and ts):
            raise Retry(f"chat.postMessage: ok, but no channel and ts in the answer ({posted_in!r}, {ts!r})")
        try:
            await slack.call("chat.delete", json_body={"channel": posted_in, "ts": ts})
        except (Retry, Failed) as exc:
            raise NotDeleted(posted_in, ts, str(exc)) from None
        return Probe(posted_in, ts, True)


class NotDeleted(Exception):
    """Posted, but ``chat.delete`` refused or failed: the message is still in the channel."""

    def __init__(self, channel: str, ts: str, why: str) -> None:
        super().__init__(f"posted to {channel} as {ts}, but not deleted: {why}")
        self.channel = channel
        self.ts = ts
