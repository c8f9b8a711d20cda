"""The ``slack`` action: tell on-call, one thread per incident.

With a bot token (``chat.postMessage`` and ``chat.update`` through slack-sdk's async client) the
firing starts a thread; later news (another action's outcome, a restore after the quiet period)
and the resolution go in it as replies, and the parent is edited to show it resolved. With an
incoming-webhook URL each notice is a message of its own (a webhook can neither thread nor edit).

Notices go through a durable outbox in the store: a run queues its notice and returns; the queue is
delivered in order, per thread, whenever Slack answers. A 429 waits for its ``Retry-After``; a
5xx, a refused connection or a timeout waits a doubling backoff; nothing is dropped, and a daemon
restart picks the queue up where it was. Each message carries its notice id in Slack's message
``metadata``: after a send whose answer was lost (a timeout, a crash), the channel is read back
before sending again, so a notice is posted once. (An incoming webhook has no way to read back:
there, at least once.)

Notices of the same incident within ``group_wait`` are one message: a firing waits that long
before it is posted, and what arrives meanwhile (the fallback's outcome, even a resolution) is in
the message it becomes.

A weekly report goes through the same outbox (``queue_report``), as a pseudo-incident of its own so
that its parts go in order: its summary as a message, then each chart uploaded into that message's
thread (``files_upload_v2``; a webhook cannot upload, so there the summary goes alone). A chart that
went missing before its turn is skipped with a note: a file that is gone will not come back.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from pathlib import Path, PurePath
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from pydantic import Field, model_validator
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome, RunOutcome
from actions.slack import message
from common.secrets import SecretRef, read_if_given
from rules.durations import Duration

log = logging.getLogger("specguard.action.slack")

STATE_KEY = "outbox"
EVENT_TYPE = "specguard_notice"
KEEP_INCIDENTS = 7 * 86400.0  # a resolved incident's thread gets news (a late restore) this long
REPORT = "report|"  # a report's pseudo-incident: report|<report id>
# Reports remembered (so that queuing one again is a no-op): a weekly report's two years. Once its
# summary is posted a report's record is a few fields.
KEEP_REPORTS = 100


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
    max_backoff: Duration = Field(300.0, gt=0)
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
        return self


class Retry(Exception):
    """Not delivered, try again (after ``after`` seconds, or the backoff). ``unsent``: Slack
    surely did not post it (a 429), so the next try need not look for it first."""

    def __init__(self, why: str, after: float | None = None, unsent: bool = False) -> None:
        super().__init__(why)
        self.after = after
        self.unsent = unsent


class Skipped(Exception):
    """Not delivered, and never will be (a chart whose file is gone): dropped, with a note."""


def _empty() -> dict[str, Any]:
    return {"next": 1, "items": [], "incidents": {}, "open": {}, "last": {}}


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
            state = state or _empty()
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
                    "actions": [_outcome(o) for o in ctx.outcomes if o.action != self.name],
                    "channel": None,
                    "ts": None,
                    "event_id": ctx.event_id,  # where history shows its deliveries
                }
                state["open"][key] = state["last"][key] = incident
                said.append(_put(state, incident, "post", now + self.slack.group_wait))
                return _pruned(state, now)
            incident = state["open"].pop(key, None)
            if incident is None or incident not in state["incidents"]:
                said.append("no incident open for this series: nothing to tell")
                return state
            record = state["incidents"][incident]
            record["resolved"] = {"at": ctx.at or now, "value": ctx.value, "summary": ctx.summary}
            if _queued_post(state, incident):
                said.append("resolved before its firing was posted: one message says both")
                return state
            said.append(_put(state, incident, "reply", now, message.resolution(ctx.at or now, ctx.value,
                                                                               ctx.threshold, ctx.summary)))  # fmt: skip
            if self._token is not None:
                _put(state, incident, "update", now)
            return state

        await memory.update(STATE_KEY, queue)
        # Delivered by the dispatcher's loop (``tick``) as soon as due, not here: a slow Slack must
        # not make this run, whose notice is safely queued, look failed.
        return Outcome(True, "; ".join(said))

    async def observe(self, outcome: RunOutcome, memory: ActionMemory) -> None:
        key = f"{outcome.rule}|{outcome.series}"
        now = time.time()

        def note(state: dict[str, Any] | None) -> dict[str, Any]:
            state = state or _empty()
            incident = state["last"].get(key)
            record = state["incidents"].get(incident) if incident else None
            if record is None or incident is None:
                return state
            record["actions"].append(_outcome(outcome))
            if not _queued_post(state, incident):
                what = f"{outcome.action}" + (" (restore)" if outcome.mode == "restore" else "")
                said = (
                    f":rotating_light: {what} FAILED: {outcome.detail}"  # a rollback, a restore refused
                    if outcome.status == "failed"
                    else f"{what}: {outcome.status}: {outcome.detail}"
                )
                _put(state, incident, "reply", now, said)
                if self._token is not None:
                    _put(state, incident, "update", now)
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
        incident = REPORT + report_id
        said: list[str] = []

        def queue(state: dict[str, Any] | None) -> dict[str, Any]:
            state = state or _empty()
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
            said.append(f"report {report_id}: " + _put(state, incident, "report", now))
            if files and self._token is None:
                why = f"{len(files)} chart(s) not attached: uploading files needs a bot token (`token`), not a webhook"
                record["notes"].append(why)
                said.append(why)
            elif files:
                taken: set[str] = set()
                for path, title in files:
                    said.append(_put(state, incident, "upload", now))
                    state["items"][-1].update(
                        {"path": str(path), "title": title, "filename": _unique(path, taken)}
                    )
            return _pruned_reports(state)

        await memory.update(STATE_KEY, queue)
        if self._token is None and files:
            log.info("slack report %s: the charts need a bot token; the summary goes alone", report_id)
        return "; ".join(said)

    # --- delivery ----------------------------------------------------------------------------

    async def tick(self, memory: ActionMemory) -> float | None:
        """Deliver every notice that is due, in order per thread; returns when the next is due."""
        async with self._lock:
            while True:
                state = await memory.read(STATE_KEY) or _empty()
                now = time.time()
                item = _next(state, now)
                if item is None:
                    dues = [i["due"] for i in state["items"]]
                    return min(dues) if dues else None
                await self._deliver(memory, state, item)

    async def _deliver(self, memory: ActionMemory, state: dict[str, Any], item: dict[str, Any]) -> None:
        incident = state["incidents"].get(item["incident"], {})
        try:
            if item["kind"] != "update" and self._token is not None:
                await memory.update(STATE_KEY, lambda s: _mark(s, item["id"], sending=True))
            where = await self._send(item, incident)
        except Skipped as exc:
            skipped = str(exc)
            log.warning("slack notice %d (%s) skipped: %s", item["id"], item["kind"], skipped)
            await memory.update(STATE_KEY, lambda s: _skip(s, item, skipped))
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
            await memory.update(
                STATE_KEY,
                lambda s: _mark(
                    s,
                    item["id"],
                    due=time.time() + wait,
                    attempts=item["attempts"] + 1,
                    error=why,
                    sending=sending,
                ),
                lambda: _note(incident, f"notice {item['id']} ({item['kind']}) not delivered yet: {why}; "
                              "retrying") if first else [],
            )  # fmt: skip
            return

        def done(s: dict[str, Any] | None) -> dict[str, Any]:
            s = s or _empty()
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
        await memory.update(STATE_KEY, done, lambda: _note(incident, text) if said else [])
        log.info(
            "slack notice %d (%s) delivered for %s", item["id"], item["kind"], item["incident"].split("|")[0]
        )

    def _backoff(self, attempts: int) -> float:
        return float(min(self.slack.max_backoff, self.slack.backoff * 2 ** max(0, attempts - 1)))

    async def _send(self, item: dict[str, Any], incident: dict[str, Any]) -> tuple[str, str] | None:
        """Deliver one notice; the (channel, ts) of a posted parent. Raises Retry, or Skipped."""
        if item["kind"] == "reply":
            text, blocks = message.reply(item["text"])
        elif item["kind"] == "report":
            text, blocks = str(incident.get("text") or ""), list(incident.get("blocks") or [])
        elif item["kind"] == "upload":
            text, blocks = "", []
        else:
            text, blocks = message.notice(incident, incident.get("resolved"))
        try:
            if self._webhook is not None:
                if item["kind"] == "update":
                    return None  # a webhook cannot edit: the reply said it
                if item["kind"] == "upload":  # queued under a bot token, the config since changed
                    raise Skipped(
                        f"chart {item['filename']} not uploaded: an incoming webhook cannot upload files"
                    )
                if item["kind"] == "reply":
                    text, blocks = message.reply(f"{incident.get('rule', '')}: {item['text']}")
                async with aiohttp.ClientSession() as session:
                    hook = AsyncWebhookClient(
                        self._webhook,
                        timeout=self.slack.request_timeout,  # type: ignore[arg-type]  # a float works
                        session=session,
                    )
                    sent = await hook.send(text=text, blocks=blocks)
                if sent.status_code == 429:
                    raise Retry("429 from the webhook", _retry_after(sent.headers), unsent=True)
                if sent.status_code != 200:
                    raise Retry(f"the webhook answered {sent.status_code} {sent.body[:100]}")
                return None
            client = AsyncWebClient(
                token=self._token,
                base_url=self.slack.base_url,
                timeout=self.slack.request_timeout,  # type: ignore[arg-type]  # a float works
                retry_handlers=[],  # retries are the outbox's: durable, and with Retry-After
            )
            if item["kind"] == "update":
                await client.chat_update(
                    channel=incident["channel"], ts=incident["ts"], text=text, blocks=blocks
                )
                return None
            if item["kind"] == "upload":
                await self._upload(client, item, incident)
                return None
            thread = incident.get("ts") if item["kind"] == "reply" else None
            if item.get("sending"):  # a send before this one may have reached Slack: look first
                found = await self._find(client, item, incident, thread)
                if found is not None:
                    return found
            answer = await client.chat_postMessage(
                channel=incident.get("channel") or self.slack.channel or "",
                text=text,
                blocks=blocks,
                thread_ts=thread,
                metadata={
                    "event_type": EVENT_TYPE,
                    "event_payload": {
                        "notice": item["id"],
                        "action": self.name,
                        **({"report": incident["report"]} if item["kind"] == "report" else {}),
                    },
                },
            )
            return str(answer["channel"]), str(answer["ts"])
        except SlackApiError as exc:
            status = exc.response.status_code
            if status == 429:
                raise Retry("429 rate limited", _retry_after(exc.response.headers), unsent=True) from None
            raise Retry(f"{status} {exc.response.get('error', '')}".strip()) from None
        except (aiohttp.ClientError, TimeoutError, SlackRequestError) as exc:
            raise Retry(f"{type(exc).__name__}: {exc}"[:200]) from None

    async def _upload(self, client: AsyncWebClient, item: dict[str, Any], report: dict[str, Any]) -> None:
        """Upload a chart into the report's thread, unless an earlier try did.

        The file is read here, before anything is sent, so that a file gone (Skipped, for good)
        is told apart from Slack not answering (Retry). slack-sdk's ``files_upload_v2`` then asks
        ``files.getUploadURLExternal`` for an upload URL, POSTs the bytes to it, and shares the file
        with ``files.completeUploadExternal``; a try that fails part way leaves an upload never
        completed, which Slack discards."""
        path = Path(item["path"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise Skipped(
                f"chart {item['filename']} ({item['title']}) not uploaded: {path}: {exc.strerror or exc}"
            ) from None
        if not report.get("ts"):
            raise Skipped(f"chart {item['filename']} not uploaded: the report's message is not known")
        if item.get("sending") and await self._shared(client, item, report):
            return
        await client.files_upload_v2(
            channel=report["channel"],
            thread_ts=report["ts"],
            file=data,
            filename=item["filename"],
            title=item["title"],
        )

    async def _shared(self, client: AsyncWebClient, item: dict[str, Any], report: dict[str, Any]) -> bool:
        """Whether the chart is in the report's thread already (a try whose answer was lost): a
        file carries no metadata, so it is known by its name and title, unique in the report."""
        answer = await client.conversations_replies(
            channel=report["channel"], ts=report["ts"], oldest=f"{item['created'] - 5:.6f}", limit=200
        )
        posted: dict[str, Any]
        shared: dict[str, Any]
        for posted in answer.get("messages", []):
            for shared in posted.get("files") or []:
                if shared.get("name") == item["filename"] and shared.get("title") == item["title"]:
                    log.info(
                        "slack chart %s was uploaded before the answer was lost: not again", item["filename"]
                    )
                    return True
        return False

    async def _find(
        self, client: AsyncWebClient, item: dict[str, Any], incident: dict[str, Any], thread: str | None
    ) -> tuple[str, str] | None:
        """The notice, if an earlier attempt did post it (its metadata says so)."""
        channel = incident.get("channel") or self.slack.channel or ""
        oldest = f"{item['created'] - 5:.6f}"
        if thread is None:
            answer = await client.conversations_history(
                channel=channel, oldest=oldest, include_all_metadata=True, limit=200
            )
        else:
            answer = await client.conversations_replies(
                channel=channel, ts=thread, oldest=oldest, include_all_metadata=True, limit=200
            )
        found: dict[str, Any]
        for found in answer.get("messages", []):
            meta: dict[str, Any] = found.get("metadata") or {}
            payload: dict[str, Any] = meta.get("event_payload") or {}
            if (
                meta.get("event_type") == EVENT_TYPE
                and payload.get("notice") == item["id"]
                and payload.get("action") == self.name
            ):
                log.info(
                    "slack notice %d was posted before the answer was lost: not posted again", item["id"]
                )
                return str(answer.get("channel") or channel), str(found["ts"])
        return None


def _note(incident: dict[str, Any], text: str) -> list[tuple[int, str]]:
    """A line for history under the firing that opened the incident."""
    event_id = incident.get("event_id")
    return [(int(event_id), text)] if event_id is not None else []


def _skip(state: dict[str, Any] | None, item: dict[str, Any], why: str) -> dict[str, Any]:
    """Drop a notice that cannot be delivered, and say why in its record."""
    state = state or _empty()
    state["items"] = [i for i in state["items"] if i["id"] != item["id"]]
    record = state["incidents"].get(item["incident"])
    if record is not None:
        record.setdefault("notes", []).append(why)
    return state


def _unique(path: str, taken: set[str]) -> str:
    """The chart's file name, made unique within its report (``a-2.png``): a chart whose upload
    answer was lost is recognised in the thread by its name."""
    name = PurePath(path).name or "chart.png"
    stem, suffix, number = PurePath(name).stem, PurePath(name).suffix, 2
    while name in taken:
        name, number = f"{stem}-{number}{suffix}", number + 1
    taken.add(name)
    return name


def _pruned_reports(state: dict[str, Any]) -> dict[str, Any]:
    """Forget all but the KEEP_REPORTS newest reports (never one with something queued)."""
    busy = {i["incident"] for i in state["items"]}
    reports = sorted(
        (record.get("queued_at") or 0.0, incident)
        for incident, record in state["incidents"].items()
        if incident.startswith(REPORT)
    )
    for _, incident in reports[: max(0, len(reports) - KEEP_REPORTS)]:
        if incident not in busy:
            del state["incidents"][incident]
    return state


def _outcome(o: RunOutcome) -> dict[str, Any]:
    name = o.action + (" (restore)" if o.mode == "restore" else "")
    return {"name": name, "detail": f"{o.status}: {o.detail}", "at": o.at}


def _put(state: dict[str, Any], incident: str, kind: str, due: float, text: str = "") -> str:
    number = state["next"]
    state["next"] = number + 1
    state["items"].append(
        {"id": number, "incident": incident, "kind": kind, "text": text, "due": due, "created": time.time(),
         "attempts": 0, "sending": False, "error": ""}
    )  # fmt: skip
    return f"notice {number} ({kind}) queued"


def _queued_post(state: dict[str, Any], incident: str) -> bool:
    return any(i["incident"] == incident and i["kind"] == "post" for i in state["items"])


def _next(state: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The first due notice that is first of its thread (so a thread's notices go in order)."""
    seen: set[str] = set()
    for item in state["items"]:
        if item["incident"] in seen:
            continue
        seen.add(item["incident"])
        if item["due"] <= now:
            return dict(item)
    return None


def _mark(state: dict[str, Any] | None, number: int, **fields: Any) -> dict[str, Any]:
    state = state or _empty()
    for item in state["items"]:
        if item["id"] == number:
            item.update(fields)
    return state


def _pruned(state: dict[str, Any], now: float) -> dict[str, Any]:
    """Forget resolved incidents older than KEEP_INCIDENTS that have nothing queued."""
    busy = {i["incident"] for i in state["items"]}
    for incident, record in list(state["incidents"].items()):
        resolved = record.get("resolved")
        if resolved and now - float(resolved["at"]) > KEEP_INCIDENTS and incident not in busy:
            del state["incidents"][incident]
            for index in ("open", "last"):
                for key, value in list(state[index].items()):
                    if value == incident:
                        del state[index][key]
    return state


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
        return max(1.0, float(value[0] if isinstance(value, list) else value))
    except (TypeError, ValueError, AttributeError):
        return None


def _webhook_ok(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")
