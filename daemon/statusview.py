"""The daemon's status (``/api/status``) as an operator reads it: a condition, a few facts and
tables of cells, each cell with a tone. ``specguard status`` prints the view as text and the page
at ``/`` as HTML, so both say the same in the same words.

Pure: the document and nothing else in, the view out; times are shown against the daemon's own
clock (``now`` in the document), so a status read from another host is not skewed. A document
that is not a daemon's status raises ValueError, KeyError or TypeError.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specguard.daemon.statustext import clock, labels_text, match_text, number, size_text
from specguard.rules.durations import format_duration


class Tone(StrEnum):
    PLAIN = ""
    GOOD = "good"
    WARN = "warn"
    BAD = "bad"
    MUTED = "muted"


class Condition(StrEnum):
    """What the daemon's state comes to, worst first."""

    UNHEALTHY = "unhealthy"  # not doing its job: rounds late, or the store cannot be written
    DEGRADED = "degraded"  # running, but blind or failing somewhere: a target down, a rule in
    # error, a feature flag whose writes fail, an action whose work fails (notices failed for good)
    HEALTHY = "healthy"


@dataclass(frozen=True)
class Cell:
    text: str
    tone: Tone = Tone.PLAIN


@dataclass(frozen=True)
class Row:
    cells: tuple[Cell, ...]
    notes: tuple[str, ...] = ()  # lines shown under the row
    silence: int | None = None  # the silence the row shows: the page offers to expire it
    data: tuple[tuple[str, str], ...] = ()  # what the page marks the row with (rule, state)


@dataclass(frozen=True)
class Section:
    title: str
    header: tuple[str, ...]
    rows: tuple[Row, ...]
    empty: str  # said instead of the table when there are no rows
    note: str | None = None  # a line under the title


@dataclass(frozen=True)
class View:
    condition: Condition
    problems: tuple[str, ...]  # why it is not healthy, one line each
    facts: tuple[tuple[str, Cell], ...]
    sections: tuple[Section, ...]
    version: str
    now: float
    firing: tuple[str, ...]  # the rules with a firing series


STATE_TONE = {"firing": Tone.BAD, "pending": Tone.WARN, "resolved": Tone.GOOD, "inactive": Tone.PLAIN}
VERDICT_TONE = {
    "breach": Tone.BAD,
    "error": Tone.BAD,
    "no_data": Tone.WARN,
    "warming_up": Tone.MUTED,
    "ok": Tone.GOOD,
}
TARGET_TONE = {"up": Tone.GOOD, "down": Tone.BAD, "warming_up": Tone.MUTED}
FLAG_TONE = {"engaged": Tone.WARN, "restored": Tone.GOOD, "unknown": Tone.BAD}
_STATE_ORDER = {"firing": 0, "pending": 1}


def build(status: Mapping[str, Any]) -> View:
    """The view of a daemon's status document."""
    if not isinstance(status, Mapping) or not isinstance(status.get("rules"), list):
        raise ValueError("no list of rules")
    now = float(status.get("now") or time.time())
    health = status.get("health") or {}
    targets = list(status.get("sources", {}).get("targets", []))
    unhealthy = health.get("healthy") is False
    problems = (
        [f"{health.get('status', 'unhealthy')}: {health.get('reason') or 'no reason given'}"]
        if unhealthy
        else []
    )
    blind = [
        f"target {t['instance']} is down: {t.get('last_error') or 'no answer'}"
        for t in targets
        if t.get("state") == "down"
    ]
    in_error = sorted({row["rule"] for row in status["rules"] if row.get("verdict") == "error"})
    blind += [f"rule {name} is in error" for name in in_error]
    blind += failing(status, now)
    fleet = status.get("fleet") or {}
    if fleet.get("unreachable_since") is not None:
        blind.append(f"the fleet's {fleet.get('store')} cannot be reached: no new restart or fallback")
    problems += blind
    condition = Condition.UNHEALTHY if unhealthy else Condition.DEGRADED if blind else Condition.HEALTHY
    return View(
        condition,
        tuple(problems),
        _facts(status, health, now),
        (
            _targets(status, targets, now),
            _rules(status["rules"], now),
            _fallbacks(status.get("fallbacks") or {}, now),
            _actions(status.get("actions"), now),
            _waiting(status.get("waiting") or [], now),
            _silences(status.get("silences"), status.get("store") or {}, now),
            _ladders(status.get("ladders")),
        ),
        str(status.get("version", "?")),
        now,
        tuple(sorted({str(row["rule"]) for row in status["rules"] if row.get("state") == "firing"})),
    )


# --- formatting ---------------------------------------------------------------------------------


def detector_line(d: Mapping[str, Any]) -> str:
    """``CUSUM G 3.1 of h 14.26; phi 20; acceptance 0.75 -> 0.63 / 0.45; last window 0.74 over 1,930
    trials, its own evidence 0 (phi 3.1)``."""
    parts = [f"CUSUM G {number(d['g'])} of h {number(d['h'])}", f"phi {number(d['phi'])}"]
    levels = " / ".join(number(level) for level in d["shift_to"]) or "-"
    source = " (the baseline's)" if d.get("in_control_from") == "baseline" else ""
    parts.append(f"acceptance {number(d['in_control'])}{source} -> {levels}")
    if d.get("window_alpha") is not None:
        window = f"last window {number(d['window_alpha'])} over {d['window_trials']:,.0f} trials"
        if d.get("window_evidence") is not None:
            window += f", its own evidence {number(d['window_evidence'])} (phi {number(d['window_phi'])})"
        parts.append(window)
    if d.get("warming_up"):
        parts.append(f"warming up ({d['warmup']})")
    if d.get("not_homogeneous"):
        parts.append(f"warm-up not homogeneous {d['not_homogeneous']}")
    return "; ".join(parts)


# --- the parts ----------------------------------------------------------------------------------


def _facts(status: Mapping[str, Any], health: Mapping[str, Any], now: float) -> tuple[tuple[str, Cell], ...]:
    facts: list[tuple[str, Cell]] = []
    if health:
        ok = health.get("healthy") is not False
        text = (
            "ok: every rule evaluated on schedule"
            if ok
            else f"{health.get('status')}: {health.get('reason')}"
        )
        facts.append(("Health", Cell(text, Tone.GOOD if ok else Tone.BAD)))
    facts.append(("Last round", Cell(clock(status.get("last_evaluation"), now))))
    if status.get("started_at") is not None:
        facts.append(("Running", Cell("since " + clock(status["started_at"], now))))
    source = str(status.get("source", "?"))
    if status.get("dry_run"):
        facts.append(("Source", Cell(f"{source}; dry run: actions are recorded, not run", Tone.WARN)))
    else:
        facts.append(("Source", Cell(source)))
    store = status.get("store") or {}
    where = str(store.get("path", "?")) + (f" ({size_text(store['bytes'])})" if store.get("bytes") else "")
    if store.get("error"):
        facts.append(("Store", Cell(f"{where}: FAILING: {store['error']}", Tone.BAD)))
    elif store.get("read_error"):
        facts.append(("Store", Cell(f"{where}: cannot be read: {store['read_error']}", Tone.BAD)))
    else:
        facts.append(("Store", Cell(f"{where}: ok", Tone.GOOD)))
    fleet = status.get("fleet")
    if fleet:  # the coordination: section's store, as this host last found it
        where = f"{fleet.get('store')} {fleet.get('url')} as {fleet.get('host')}"
        if fleet.get("unreachable_since") is not None:
            text = f"{where}: CANNOT BE REACHED since {clock(fleet['unreachable_since'], now)}: {fleet.get('last_error')}"
            facts.append(("Fleet", Cell(text + "; no new restart or fallback meanwhile", Tone.BAD)))
        else:
            facts.append(("Fleet", Cell(f"{where}: ok", Tone.GOOD)))
    webhook = status.get("webhook")
    if webhook:
        token = "bearer token required" if webhook.get("authenticated") else "no token (loopback only)"
        counts = webhook.get("watched_alerts") or {}
        watched = ", ".join(f"{count} {state}" for state, count in sorted(counts.items())) or "none"
        facts.append(("Webhook", Cell(f"{webhook.get('path')}, {token}; watched alerts: {watched}")))
    return tuple(facts)


def _targets(status: Mapping[str, Any], targets: Sequence[Mapping[str, Any]], now: float) -> Section:
    rows = []
    for t in targets:
        notes = []
        if t.get("last_error"):
            since = f" since {clock(t['error_since'], now)}" if t.get("error_since") else ""
            notes.append(f"{t['last_error']}{since} ({t.get('failures', 0)} failed scrape(s) in all)")
        state = str(t.get("state", "?"))
        rows.append(
            Row(
                (
                    Cell(str(t.get("instance", "?"))),
                    Cell(state, TARGET_TONE.get(state, Tone.PLAIN)),
                    Cell(clock(t.get("last_success"), now)),
                    Cell(str(t.get("target", "?"))),
                ),
                tuple(notes),
            )
        )
    prometheus = status.get("source") == "prometheus"
    empty = "none of its own: Prometheus scrapes the servers" if prometheus else "none"
    up = sum(1 for t in targets if t.get("state") == "up")
    title = f"Targets ({up}/{len(targets)} up)" if targets else "Targets"
    return Section(title, ("INSTANCE", "STATE", "LAST SCRAPE (UTC)", "URL"), tuple(rows), empty)


def _rules(rows: Sequence[Mapping[str, Any]], now: float) -> Section:
    ordered = sorted(
        enumerate(rows), key=lambda item: (_STATE_ORDER.get(str(item[1].get("state")), 2), item[0])
    )
    out = []
    for _, row in ordered:
        state, verdict = str(row.get("state", "?")), row.get("verdict")
        notes = []
        for key in ("reason", "error"):
            if row.get(key) and row.get(key) not in notes:
                notes.append(str(row[key]))
        if row.get("detector"):
            notes.append(detector_line(row["detector"]))
        if row.get("shadow"):
            notes.append("shadow: evaluated and recorded, its actions are not run")
        window = row.get("window")
        out.append(
            Row(
                (
                    Cell(str(row["rule"])),
                    Cell(labels_text(row.get("labels"))),
                    Cell(state, STATE_TONE.get(state, Tone.PLAIN)),
                    Cell(clock(row.get("since"), now) if row.get("since") else "-"),
                    Cell(number(row.get("value"))),
                    Cell(
                        str(row.get("condition"))
                        if row.get("threshold") is None
                        else number(row["threshold"])
                    ),
                    Cell(str(verdict or "-"), VERDICT_TONE.get(str(verdict), Tone.PLAIN)),
                    Cell(format_duration(window) if isinstance(window, int | float) else "-"),
                ),
                tuple(notes),
                data=(("rule", str(row["rule"])), ("state", state)),
            )
        )
    names = {str(row["rule"]) for row in rows}
    firing = {str(row["rule"]) for row in rows if row.get("state") == "firing"}
    pending = {str(row["rule"]) for row in rows if row.get("state") == "pending"}
    title = f"Rules ({len(names)}, {len(firing)} firing, {len(pending)} pending)"
    header = ("RULE", "SERIES", "STATE", "SINCE (UTC)", "VALUE", "THRESHOLD", "VERDICT", "OVER")
    return Section(title, header, tuple(out), "no rule is enabled")


def _fallbacks(fallbacks: Mapping[str, Mapping[str, Any]], now: float) -> Section:
    rows = []
    for name, flag in sorted(fallbacks.items()):
        state = str(flag.get("is") or "?")
        since = (
            f" since {clock(flag['is_since'], now)}" if flag.get("is_since") and state == "engaged" else ""
        )
        notes = [str(flag["why"])] if flag.get("why") else []
        holders = list(flag.get("holders") or [])
        if len(holders) > 3:  # the reason names three
            notes.append("held by " + ", ".join(holders))
        if flag.get("failing_since") is not None:
            notes.append(_trouble(flag, now))
        rows.append(
            Row(
                (
                    Cell(name),
                    Cell(state + since, FLAG_TONE.get(state, Tone.PLAIN)),
                    Cell(str(flag.get("should_be") or "-")),
                    Cell(clock(flag.get("restore_at"), now) if flag.get("restore_at") else "-"),
                ),
                tuple(notes),
            )
        )
    header = ("ACTION", "IS", "SHOULD BE", "RESTORE AT (UTC)")
    return Section("Fallbacks", header, tuple(rows), "no feature_flag action")


def _trouble(flag: Mapping[str, Any], now: float) -> str:
    """``changes failing since 14:03:10 (3m ago), 4 writes failed in a row; last error 14:05:40
    (1m ago): engage: PUT ... answered 500; next try 14:07:00 (in 20s)``."""
    counts = []
    if flag.get("failures"):
        counts.append(f"{flag['failures']} write(s) failed in a row")
    if flag.get("canary_failures"):
        counts.append(f"{flag['canary_failures']} canary probe(s) kept it engaged")
    parts = [
        f"changes failing since {clock(flag.get('failing_since'), now)}" + "".join(f", {c}" for c in counts)
    ]
    if flag.get("last_error"):
        parts.append(f"last error {clock(flag.get('last_error_at'), now)}: {flag['last_error']}")
    if flag.get("next_try") is not None:
        parts.append(f"next try {clock(flag['next_try'], now)}")
    return "; ".join(parts)


def failing(status: Mapping[str, Any], now: float) -> list[str]:
    """What fails among the actions, one line each: a feature flag whose writes fail (a canary that
    keeps a fallback engaged is its job, not a failure), an action that says it is failing."""
    out = []
    for name, flag in sorted((status.get("fallbacks") or {}).items()):
        if flag.get("failures"):
            out.append(f"fallback {name} cannot be written: {flag.get('last_error') or 'no reason given'}")
    for name, action in sorted((status.get("actions") or {}).items()):
        state = action.get("state")
        if isinstance(state, Mapping) and state.get("failing"):
            out.append(f"action {name} is failing: {state_text(state, now)}")
    return out


def state_text(state: Mapping[str, Any], now: float) -> str:
    """What an action says of itself (``Action.state``), in words: ``3 waiting, 1 failing, 4 failed in all; last error
    14:05:40 (1m ago): channel_not_found; next try 14:07:00 (in 20s)``; keys not known here as
    ``key: value``."""
    counts = []
    if isinstance(state.get("backlog"), int) and not isinstance(state.get("backlog"), bool):
        counts.append(f"{state['backlog']} waiting")
    failing = state.get("failing")
    if isinstance(failing, bool):
        counts.append("failing" if failing else "not failing")
    elif isinstance(failing, int | float):
        counts.append(f"{number(failing)} failing")
    failed = state.get("failed")  # for good, ever: said once there were some
    if isinstance(failed, int | float) and not isinstance(failed, bool) and failed:
        counts.append(f"{number(failed)} failed in all")
    parts = [", ".join(counts)] if counts else []
    if state.get("last_error"):
        at = f" {clock(state['last_error_at'], now)}" if state.get("last_error_at") is not None else ""
        parts.append(f"last error{at}: {state['last_error']}")
    if state.get("next_try") is not None:
        parts.append(f"next try {clock(state['next_try'], now)}")
    known = {"backlog", "failing", "failed", "last_error", "last_error_at", "next_try"}
    parts += [f"{key}: {number(value)}" for key, value in sorted(state.items()) if key not in known]
    return "; ".join(parts) or "-"


def _actions(actions: Mapping[str, Mapping[str, Any]] | None, now: float) -> Section:
    header = ("ACTION", "TYPE", "STATE")
    if actions is None:
        return Section("Actions", header, (), "unknown", "not shown: this daemon does not report its actions")
    rows = []
    for name, action in sorted(actions.items()):
        state = action.get("state")
        if isinstance(state, Mapping):
            text = state_text(state, now)
            tone = Tone.BAD if state.get("failing") else Tone.WARN if state.get("last_error") else Tone.PLAIN
        else:  # not read: the store did not answer, or the action could not say
            text, tone = ("-" if state is None else str(state)), Tone.MUTED
        rows.append(Row((Cell(name), Cell(str(action.get("type", "?"))), Cell(text, tone))))
    return Section("Actions", header, tuple(rows), "no action is configured")


def _waiting(waiting: Sequence[Mapping[str, Any]], now: float) -> Section:
    rows = []
    for run in waiting:
        status = str(run.get("status", "?"))
        notes = [str(run["why"])] if run.get("why") else []
        if run.get("attempts"):
            notes.append(f"{run['attempts']} attempt(s) so far")
        rows.append(
            Row(
                (
                    Cell(str(run.get("run", "?"))),
                    Cell(
                        str(run.get("action", "?"))
                        + (f" ({run['mode']})" if run.get("mode") not in (None, "run") else "")
                    ),
                    Cell(str(run.get("rule", "?"))),
                    Cell(labels_text(run.get("labels"))),
                    Cell(str(run.get("event", "?"))),
                    Cell(status, Tone.WARN if status == "deferred" else Tone.PLAIN),
                    Cell(clock(run.get("until"), now) if run.get("until") else "-"),
                ),
                tuple(notes),
            )
        )
    header = ("RUN", "ACTION", "RULE", "SERIES", "EVENT", "STATUS", "UNTIL (UTC)")
    return Section("Waiting runs", header, tuple(rows), "none: no run is deferred or under way")


def _silences(found: Sequence[Mapping[str, Any]] | None, store: Mapping[str, Any], now: float) -> Section:
    header = ("ID", "RULE", "MATCH", "STATE", "ENDS (UTC)", "AUTHOR", "REASON")
    if found is None:
        note = "not shown: " + str(store.get("read_error") or "this daemon does not report its silences")
        return Section("Silences", header, (), "unknown", note)
    rows = []
    for item in found:
        state = str(item.get("state") or ("active" if item["starts"] <= now else "pending"))
        rows.append(
            Row(
                (
                    Cell(str(item["id"])),
                    Cell(str(item["rule"])),
                    Cell(match_text(item.get("match") or {})),
                    Cell(state, Tone.WARN if state == "active" else Tone.MUTED),
                    Cell(clock(item["ends"], now)),
                    Cell(str(item.get("author", "?"))),
                    Cell(str(item.get("reason", ""))),
                ),
                silence=int(item["id"]),
            )
        )
    return Section(f"Silences ({len(rows)})", header, tuple(rows), "none in force or to come")


def _ladders(ladders: Sequence[Mapping[str, Any]] | None) -> Section:
    header = ("ACTION", "K", "LADDER", "CONFIG FILE SAYS", "UNDER WAY")
    if ladders is None:
        return Section("Ladders", header, (), "unknown", "not shown: this daemon does not report its ladders")
    rows = []
    for item in ladders:
        k = item.get("k")
        rungs = " ".join(f"[{rung}]" if rung == k else str(rung) for rung in item.get("ladder", []))
        change = item.get("change")
        under_way = (
            "-" if not change else f"k {change.get('from')} -> {change.get('to')} at {change.get('phase')}"
        )
        notes = tuple(
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(entry['at']))} k {entry['from']} -> {entry['to']} "
            f"{'ok' if entry.get('ok') else 'FAILED'}: {entry.get('reason', '')}"
            for entry in item.get("log", [])
        )
        rows.append(
            Row(
                (
                    Cell(str(item.get("action", "?"))),
                    Cell(str(k)),
                    Cell(rungs or "-"),
                    Cell(f"k={item.get('file_k')}"),
                    Cell(under_way, Tone.WARN if change else Tone.PLAIN),
                ),
                notes,
            )
        )
    return Section("Ladders", header, tuple(rows), "no vllm_restart action")
