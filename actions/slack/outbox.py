"""The ``slack`` action's outbox, as kept in its memory (one JSON value): the notices queued, in
order, the incidents (and reports) they belong to, and what went wrong last. The functions here
change or read that value; they do no I/O.

``items``: the notices not delivered yet (``id``, ``incident``, ``kind``, ``due`` unix time, ...).
``failed``: the latest notices failed for good (``FAILED_KEPT`` of them), ``failures``: how many
ever were, ``failing``: how many since the last notice delivered (Slack refuses them now; a
delivery says it takes them again), ``last_error``: ``{"text", "at"}`` of the latest failed try,
permanent or not.
"""

from __future__ import annotations

import math
import time
from pathlib import PurePath
from typing import Any

from specguard.store.records import RunOutcome

KEEP_INCIDENTS = 7 * 86400.0  # a resolved incident's thread gets news (a late restore) this long
REPORT = "report|"  # a report's pseudo-incident: report|<report id>
# Reports remembered (so that queuing one again is a no-op): a weekly report's two years. Once its
# summary is posted a report's record is a few fields.
KEEP_REPORTS = 100
FAILED_KEPT = 20  # notices failed for good whose record is kept


def empty() -> dict[str, Any]:
    return {"next": 1, "items": [], "incidents": {}, "open": {}, "last": {}}


def put(state: dict[str, Any], incident: str, kind: str, due: float, text: str = "") -> str:
    number = state["next"]
    state["next"] = number + 1
    state["items"].append(
        {"id": number, "incident": incident, "kind": kind, "text": text, "due": due, "created": time.time(),
         "attempts": 0, "sending": False, "error": ""}
    )  # fmt: skip
    return f"notice {number} ({kind}) queued"


def queued_post(state: dict[str, Any], incident: str) -> bool:
    return any(i["incident"] == incident and i["kind"] == "post" for i in state["items"])


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def unreadable_dues(state: dict[str, Any]) -> bool:
    """Whether a notice's ``due`` is not a finite time (``Infinity`` or ``NaN``, as an older
    version could store from a ``Retry-After: inf``): ``repaired`` makes it due now."""
    return any(not finite(item.get("due")) for item in state["items"])


def repaired(state: dict[str, Any] | None, now: float) -> dict[str, Any]:
    state = state or empty()
    for item in state["items"]:
        if not finite(item.get("due")):
            item["due"] = now
    return state


def next_due(state: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The first due notice that is first of its thread (so a thread's notices go in order). A
    notice whose due time cannot be read is due."""
    seen: set[str] = set()
    for item in state["items"]:
        if item["incident"] in seen:
            continue
        seen.add(item["incident"])
        if not finite(item.get("due")) or item["due"] <= now:
            return dict(item)
    return None


def when_next(state: dict[str, Any], now: float) -> float | None:
    """When the next notice is due (unix time; ``now`` for one whose due time cannot be read)."""
    dues = [i["due"] if finite(i.get("due")) else now for i in state["items"]]
    return min(dues) if dues else None


def mark(state: dict[str, Any] | None, number: int, **fields: Any) -> dict[str, Any]:
    state = state or empty()
    for item in state["items"]:
        if item["id"] == number:
            item.update(fields)
    return state


def errored(state: dict[str, Any], why: str, at: float) -> dict[str, Any]:
    state["last_error"] = {"text": why, "at": at}
    return state


def failed(state: dict[str, Any] | None, item: dict[str, Any], why: str, at: float) -> dict[str, Any]:
    """Take a notice that will never be delivered off the queue, and keep why."""
    state = state or empty()
    state["items"] = [i for i in state["items"] if i["id"] != item["id"]]
    state["failures"] = int(state.get("failures") or 0) + 1
    state["failing"] = int(state.get("failing") or 0) + 1
    kept = list(state.get("failed") or [])
    kept.append({"id": item["id"], "incident": item["incident"], "kind": item["kind"], "error": why, "at": at,
                 "attempts": item["attempts"] + 1})  # fmt: skip
    state["failed"] = kept[-FAILED_KEPT:]
    return errored(state, why, at)


def delivered(state: dict[str, Any]) -> dict[str, Any]:
    """A notice was delivered: Slack takes them, whatever failed before."""
    state["failing"] = 0
    return state


def summary(state: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """What ``/api/status`` shows of the outbox."""
    state = state or empty()
    last = state.get("last_error") or {}
    return {
        "backlog": len(state["items"]),
        "failing": int(state.get("failing") or 0),
        "failed": int(state.get("failures") or 0),
        "last_error": last.get("text"),
        "last_error_at": last.get("at"),
        "next_try": when_next(state, now),
    }


def skip(state: dict[str, Any] | None, item: dict[str, Any], why: str) -> dict[str, Any]:
    """Drop a notice that cannot be delivered, and say why in its record."""
    state = state or empty()
    state["items"] = [i for i in state["items"] if i["id"] != item["id"]]
    record = state["incidents"].get(item["incident"])
    if record is not None:
        record.setdefault("notes", []).append(why)
    return state


def note(incident: dict[str, Any], text: str) -> list[tuple[int, str]]:
    """A line for history under the firing that opened the incident."""
    event_id = incident.get("event_id")
    return [(int(event_id), text)] if event_id is not None else []


def unique(path: str, taken: set[str]) -> str:
    """The chart's file name, made unique within its report (``a-2.png``): a chart whose upload
    answer was lost is recognised in the thread by its name."""
    name = PurePath(path).name or "chart.png"
    stem, suffix, number = PurePath(name).stem, PurePath(name).suffix, 2
    while name in taken:
        name, number = f"{stem}-{number}{suffix}", number + 1
    taken.add(name)
    return name


def pruned_reports(state: dict[str, Any]) -> dict[str, Any]:
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


def pruned(state: dict[str, Any], now: float) -> dict[str, Any]:
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


def outcome(o: RunOutcome) -> dict[str, Any]:
    name = o.action + (" (restore)" if o.mode == "restore" else "")
    return {"name": name, "detail": f"{o.status}: {o.detail}", "at": o.at}
