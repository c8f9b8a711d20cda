"""The ``slack`` action: tell on-call, one thread per incident.

With a bot token (``chat.postMessage`` and ``chat.update`` of Slack's Web API, sent by
``actions.slack.web``) the firing starts a thread; later news (another action's outcome, a restore
after the quiet period) and the resolution go in it as replies, and the parent is edited to show it
resolved. With an incoming-webhook URL each notice is a message of its own (a webhook can neither
thread nor edit).

Notices go through a durable outbox in the store (``actions.slack.outbox``): a run queues its
notice and returns; the queue is delivered in order, per thread, whenever Slack answers. A 429 waits
for its ``Retry-After`` (at most ``max_backoff``); a 5xx, a refused connection, a timeout or an
answer over ``max_response_size`` waits a doubling backoff; nothing is dropped, and a daemon
restart picks the queue up where it was. An error that waiting does not mend (a revoked token, a
channel not found, a 4xx) marks the notice failed for good: logged once, kept in the outbox, and
counted in ``state``. Each message carries its notice id in Slack's message ``metadata``: after a
send whose answer was lost (a timeout, a crash, an answer that does not say where the message went),
the channel is read back before sending again, so a notice is posted once. (An incoming webhook has
no way to read back: there, at least once.)

Notices of the same incident within ``group_wait`` are one message: a firing waits that long
before it is posted, and what arrives meanwhile (the fallback's outcome, even a resolution) is in
the message it becomes.

A weekly report goes through the same outbox (``queue_report``), as a pseudo-incident of its own so
that its parts go in order: its summary as a message, then each chart uploaded into that message's
thread (Slack's external upload; a webhook cannot upload, so there the summary goes alone). A chart
that went missing before its turn is skipped with a note: a file that is gone will not come back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import socket
import time
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome
from specguard.actions.sizes import ResponseSize
from specguard.actions.slack import message
from specguard.actions.slack import outbox as box
from specguard.actions.slack.probe import Probe, post_and_delete
from specguard.actions.slack.sending import EVENT_TYPE, find, posted, upload
from specguard.actions.slack.web import Failed, Retry, Skipped, Slack
from specguard.common.http import MAX_RESPONSE_SIZE
from specguard.common.secrets import SecretRef, read_if_given
from specguard.rules.durations import Duration
from specguard.store.records import RunOutcome

__all__ = ["Failed", "Retry", "Skipped", "SlackAction", "SlackParams"]

log = logging.getLogger("specguard.action.slack")

STATE_KEY = "outbox"


class SlackParams(ActionParams):
    type: Literal["slack"] = "slack"
    timeout: Duration = Field(120.0, gt=0)  # a run queues; a delivery pass sends what is due
    token: SecretRef | None = None  # a bot token (xoxb-...): threads and edits
    channel: str | None = None  # for the bot: the channel's id (C0123...)
    webhook_url: SecretRef | None = None  # or an incoming-webhook URL (itself a secret)
    base_url: str = "https://slack.com/api/"  # the Web API (a proxy's, or a test's)
    group_wait: Duration = Field(10.0, ge=0)
    request_timeout: Duration = Field(10.0, gt=0)
    backoff: Duration = Field(5.0, gt=0)  # after a failed delivery; doubled each time
    max_backoff: Duration = Field(300.0, gt=0)  # also the longest Retry-After obeyed
    max_response_size: ResponseSize = MAX_RESPONSE_SIZE  # of an answer's body
    host: str | None = None  # shown in messages; default: this machine's name

    @model_validator(mode="after")
    def _one_way(self) -> SlackParams:
        if (self.token is None) == (self.webhook_url is None):
            raise ValueError("give `token` (a bot token, with `channel`) or `webhook_url`, one of them")
        if self.token is not None and not self.channel:
            raise ValueError("a bot token needs the `channel` to post in")
        if self.channel is not None and not re.fullmatch(r"[CGD][A-Z0-9]{6,}", self.channel):
            raise ValueError(
                f"channel {self.channel!r}: give the channel's id (C0123ABCD, from the channel's details "
                "in Slack): reading the channel back after a lost answer takes an id, not a name"
            )
        if not self.base_url.endswith("/"):
            raise ValueError("base_url ends with a slash, e.g. https://slack.com/api/")
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"max_backoff ({self.max_backoff:g}s) is shorter than backoff ({self.backoff:g}s): "
                "the backoff doubles from `backoff` up to `max_backoff`"
            )
        return self


class SlackAction(Action):
    type = "slack"
    Params = SlackParams
    observes = True

    def __init__(self, name: str, params: ActionParams) -> None:
        super().__init__(name, params)
        assert isinstance(params, SlackParams)
        self.slack = params
        where = f"actions.{name}"
        self._token = read_if_given(params.token, f"{where}.token")
        self._webhook = read_if_given(params.webhook_url, f"{where}.webhook_url")
        if self._webhook is not None and not _webhook_ok(self._webhook):
            raise ValueError(f"{where}.webhook_url: give an https:// URL (http:// only on loopback)")
        self.host = params.host or socket.gethostname()
        self._lock = asyncio.Lock()  # one delivery pass at a time

    # --- queueing ----------------------------------------------------------------------------

    async def run(self, ctx: ActionContext) -> Outcome:
        memory = self.memory(ctx)
        now = time.time()
        key = f"{ctx.rule}|{ctx.series}"
        said: list[str] = []

        def queue(state: dict[str, Any] | None) -> dict[str, Any]:
            state = state or box.empty()
            if ctx.event == "firing":
                incident = f"{key}|{ctx.event_id}"
                if incident in state["incidents"]:  # this firing's run, repeated after a crash
                    said.append(f"already {'posted' if state['incidents'][incident].get('ts') else 'queued'} "
                                "for this firing: one thread per incident")  # fmt: skip
                    return state
                state["incidents"][incident] = {
                    "rule": ctx.rule,
                    "severity": ctx.severity,
                    "host": self.host,
                    "labels": dict(ctx.labels),
                    "value": ctx.value,
                    "threshold": ctx.threshold,
                    "summary": ctx.summary,
                    "fired_at": ctx.at or now,
                    "since": ctx.since,  # the breach began
                    "annotations": dict(ctx.annotations),
                    "actions": [box.outcome(o) for o in ctx.outcomes if o.action != self.name],
                    "channel": None,
                    "ts": None,
                    "event_id": ctx.event_id,  # where history shows its deliveries
                }
                state["open"][key] = state["last"][key] = incident
                said.append(box.put(state, incident, "post", now + self.slack.group_wait))
                return box.pruned(state, now)
            incident = state["open"].pop(key, None)
            if incident is None or incident not in state["incidents"]:
                said.append("no incident open for this series: nothing to tell")
                return state
            record = state["incidents"][incident]
            record["resolved"] = {"at": ctx.at or now, "value": ctx.value, "summary": ctx.summary}
            if box.queued_post(state, incident):
                said.append("resolved before its firing was posted: one message says both")
                return state
            said.append(box.put(state, incident, "reply", now, message.resolution(ctx.at or now, ctx.value,
                                                                               ctx.threshold, ctx.summary)))  # fmt: skip
            if self._token is not None:
                box.put(state, incident, "update", now)
            return state

        await memory.update(STATE_KEY, queue)
        # Delivered by the dispatcher's loop (``tick``) as soon as due, not here: a slow Slack must
        # not make this run, whose notice is safely queued, look failed.
        return Outcome(True, "; ".join(said))

    async def observe(self, outcome: RunOutcome, memory: ActionMemory) -> None:
        key = f"{outcome.rule}|{outcome.series}"
        now = time.time()

        def note(state: dict[str, Any] | None) -> dict[str, Any]:
            state = state or box.empty()
            incident = state["last"].get(key)
            record = state["incidents"].get(incident) if incident else None
            if record is None or incident is None:
                return state
            record["actions"].append(box.outcome(outcome))
            if not box.queued_post(state, incident):
                what = f"{outcome.action}" + (" (restore)" if outcome.mode == "restore" else "")
                if outcome.status == "failed":  # a rollback, a restore refused
                    said = f":rotating_light: {what} FAILED: {outcome.detail}"
                elif outcome.page:  # a restart deferred, the fleet's store down; a step done without a slot
                    # (a deferral's detail starts "deferred: ": said once)
                    detail = outcome.detail.removeprefix(f"{outcome.status}: ")
                    said = f":rotating_light: {what}: {outcome.status}: {detail}"
                else:
                    said = f"{what}: {outcome.status}: {outcome.detail}"
                box.put(state, incident, "reply", now, said)
                if self._token is not None:
                    box.put(state, incident, "update", now)
            return state

        await memory.update(STATE_KEY, note)

    async def queue_report(
        self,
        memory: ActionMemory,
        report_id: str,
        text: str,
        blocks: list[dict[str, Any]],
        files: list[tuple[str, str]],
    ) -> str:
        """Queue a finished report: its summary (``text``, ``blocks``) as a message, then each
        chart of ``files`` ((path, title) of a PNG) uploaded into its thread; returns what was
        queued. Delivered by ``tick``, like the notices. A report already queued (or posted) under
        ``report_id`` is not queued again: whoever makes reports may offer one twice (after a
        restart) without it being posted twice."""
        incident = box.REPORT + report_id
        said: list[str] = []

        def queue(state: dict[str, Any] | None) -> dict[str, Any]:
            state = state or box.empty()
            known = state["incidents"].get(incident)
            if known is not None:
                done = known.get("posted_at") is not None
                said.append(
                    f"report {report_id} is already {'posted' if done else 'queued'}: not queued again"
                )
                return state
            now = time.time()
            record: dict[str, Any] = {
                "report": report_id,
                "text": text,
                "blocks": blocks,
                "queued_at": now,
                "posted_at": None,
                "channel": None,
                "ts": None,
                "uploaded": [],
                "notes": [],
            }
            state["incidents"][incident] = record
            said.append(f"report {report_id}: " + box.put(state, incident, "report", now))
            if files and self._token is None:
                why = f"{len(files)} chart(s) not attached: uploading files needs a bot token (`token`), not a webhook"
                record["notes"].append(why)
                said.append(why)
            elif files:
                taken: set[str] = set()
                for path, title in files:
                    said.append(box.put(state, incident, "upload", now))
                    state["items"][-1].update(
                        {"path": str(path), "title": title, "filename": box.unique(path, taken)}
                    )
            return box.pruned_reports(state)

        await memory.update(STATE_KEY, queue)
        if self._token is None and files:
            log.info("slack report %s: the charts need a bot token; the summary goes alone", report_id)
        return "; ".join(said)

    # --- delivery ----------------------------------------------------------------------------

    async def tick(self, memory: ActionMemory) -> float | None:
        """Deliver every notice that is due, in order per thread; returns when the next is due."""
        async with self._lock:
            while True:
                state = await memory.read(STATE_KEY) or box.empty()
                now = time.time()
                if box.unreadable_dues(state):  # stored by an older version: due now, and finite
                    log.warning("slack outbox: a notice's due time was not a finite time; due now")
                    state = await memory.update(STATE_KEY, functools.partial(box.repaired, now=now))
                item = box.next_due(state, now)
                if item is None:
                    return box.when_next(state, now)
                await self._deliver(memory, state, item)

    async def state(self, memory: ActionMemory) -> dict[str, Any]:
        """The outbox: ``backlog`` (notices not delivered yet), ``failing`` (notices failed for
        good since the last one delivered: Slack refuses them now), ``failed`` (notices failed for
        good, ever), ``last_error`` and ``last_error_at`` (of the latest failed try, permanent or
        not), ``next_try`` (when the next notice is due; None: none is queued)."""
        return box.summary(await memory.read(STATE_KEY), time.time())

    async def _deliver(self, memory: ActionMemory, state: dict[str, Any], item: dict[str, Any]) -> None:
        incident = state["incidents"].get(item["incident"], {})
        try:
            if item["kind"] != "update" and self._token is not None:
                await memory.update(STATE_KEY, lambda s: box.mark(s, item["id"], sending=True))
            where = await self._send(item, incident)
        except Skipped as exc:
            skipped = str(exc)
            log.warning("slack notice %d (%s) skipped: %s", item["id"], item["kind"], skipped)
            await memory.update(STATE_KEY, lambda s: box.skip(s, item, skipped))
            return
        except Failed as exc:
            reason = str(exc)
            log.error(
                "slack notice %d (%s) failed for good, not retried: %s", item["id"], item["kind"], reason
            )
            await memory.update(
                STATE_KEY,
                lambda s: box.failed(s, item, reason, time.time()),
                lambda: box.note(
                    incident, f"notice {item['id']} ({item['kind']}) FAILED, not retried: {reason}"
                ),
            )
            return
        except Retry as exc:
            wait = exc.after if exc.after is not None else self._backoff(item["attempts"] + 1)
            # Once a try may have reached Slack, every later one looks for it first.
            why, sending = (
                str(exc),
                (bool(item.get("sending")) or not exc.unsent) and item["kind"] != "update",
            )
            log.warning("slack notice %d not delivered (%s); again in %.1fs", item["id"], why, wait)
            first = item["attempts"] == 0  # history hears of the first failure, the log of each
            at = time.time()
            await memory.update(
                STATE_KEY,
                lambda s: box.errored(
                    box.mark(s, item["id"], due=at + wait, attempts=item["attempts"] + 1, error=why,
                             sending=sending),
                    why,
                    at,
                ),
                lambda: box.note(incident, f"notice {item['id']} ({item['kind']}) not delivered yet: {why}; "
                                 "retrying") if first else [],
            )  # fmt: skip
            return

        def done(s: dict[str, Any] | None) -> dict[str, Any]:
            s = box.delivered(s or box.empty())
            s["items"] = [i for i in s["items"] if i["id"] != item["id"]]
            record = s["incidents"].get(item["incident"])
            if record is not None and item["kind"] in ("post", "report") and where is not None:
                record["channel"], record["ts"] = where
            if record is not None and item["kind"] == "report":  # what it said is in Slack now
                record.pop("text", None)
                record.pop("blocks", None)
                record["posted_at"] = time.time()
            if record is not None and item["kind"] == "upload":
                record.setdefault("uploaded", []).append(item["filename"])
            return s

        if self._webhook is not None:
            said = "posted through the incoming webhook" if item["kind"] != "update" else ""
        elif item["kind"] in ("post", "report") and where is not None:
            said = f"posted to {where[0]} (ts {where[1]})"
        elif item["kind"] == "upload":
            said = f"uploaded {item['filename']} into the report's thread"
        elif item["kind"] == "reply":
            said = f"replied in the thread: {message.cut(item['text'], 80)}"
        else:
            said = "updated the thread's first message"
        text = f"notice {item['id']} {said}"
        await memory.update(STATE_KEY, done, lambda: box.note(incident, text) if said else [])
        log.info(
            "slack notice %d (%s) delivered for %s", item["id"], item["kind"], item["incident"].split("|")[0]
        )

    def _backoff(self, attempts: int) -> float:
        doublings = min(max(0, attempts - 1), 60)  # 2**60 backoffs is past any max_backoff
        return float(min(self.slack.max_backoff, self.slack.backoff * 2**doublings))

    async def post_test(self, text: str) -> Probe:
        """Post ``text`` and delete it (``actions.slack.probe``): whether this action reaches its channel."""
        return await post_and_delete(self._client(), self.slack.channel, self._webhook, text)

    def _client(self) -> Slack:
        return Slack(
            token=self._token,
            base_url=self.slack.base_url,
            timeout=self.slack.request_timeout,
            limit=self.slack.max_response_size,
            cap=self.slack.max_backoff,
        )

    async def _send(self, item: dict[str, Any], incident: dict[str, Any]) -> tuple[str, str] | None:
        """Deliver one notice; the (channel, ts) of a posted parent. Raises Retry, Failed or
        Skipped."""
        if item["kind"] == "reply":
            text, blocks = message.reply(item["text"])
        elif item["kind"] == "report":
            text, blocks = str(incident.get("text") or ""), list(incident.get("blocks") or [])
        elif item["kind"] == "upload":
            text, blocks = "", []
        else:
            text, blocks = message.notice(incident, incident.get("resolved"))
        if self._webhook is not None:
            if item["kind"] == "update":
                return None  # a webhook cannot edit: the reply said it
            if item["kind"] == "upload":  # queued under a bot token, the config since changed
                raise Skipped(
                    f"chart {item['filename']} not uploaded: an incoming webhook cannot upload files"
                )
            if item["kind"] == "reply":
                text, blocks = message.reply(f"{incident.get('rule', '')}: {item['text']}")
            async with self._client() as slack:
                await slack.webhook(self._webhook, {"text": text, "blocks": blocks})
            return None
        if item["kind"] in ("reply", "update") and not posted(incident):
            # its thread's first message failed for good (or was never known): no thread to go in
            raise Failed(f"the thread's first message was never posted: no thread for this {item['kind']}")
        async with self._client() as slack:
            if item["kind"] == "update":
                await slack.call(
                    "chat.update",
                    json_body={
                        "channel": incident["channel"],
                        "ts": incident["ts"],
                        "text": text,
                        "blocks": blocks,
                    },
                )
                return None
            if item["kind"] == "upload":
                await upload(slack, item, incident)
                return None
            thread = incident["ts"] if item["kind"] == "reply" else None
            channel = incident.get("channel") or self.slack.channel or ""
            if item.get("sending"):  # a send before this one may have reached Slack: look first
                found = await find(slack, self.name, item, channel, thread)
                if found is not None:
                    return found
            answer = await slack.call(
                "chat.postMessage",
                json_body={
                    "channel": channel,
                    "text": text,
                    "blocks": blocks,
                    **({"thread_ts": thread} if thread is not None else {}),
                    "metadata": {
                        "event_type": EVENT_TYPE,
                        "event_payload": {
                            "notice": item["id"],
                            "action": self.name,
                            **({"report": incident["report"]} if item["kind"] == "report" else {}),
                        },
                    },
                },
            )
            posted_in, ts = answer.get("channel"), answer.get("ts")
            if not (isinstance(posted_in, str) and posted_in and isinstance(ts, str) and ts):
                # Not a delivery: where it went is not known. The next try looks for it first.
                raise Retry(
                    f"chat.postMessage: ok, but the answer gives no channel and ts "
                    f"(channel {posted_in!r}, ts {ts!r}): not taken as delivered"[:200]
                )
            return posted_in, ts


def _webhook_ok(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")
