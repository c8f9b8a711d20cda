"""What the demo tells on the terminal: the banner, the daemon's events and action runs, the router's
moves (the demo's own router's, or nginx's as its answers name the pool) and Slack's messages as they come (each marked by time, for the summary), a pulse line every
few seconds, and the summary of the loop at the end."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.config.loading import LoadedRule
from specguard.daemon.runtime import Daemon
from specguard.demo.report import Terminal
from specguard.demo.scenario import (
    CHANNEL,
    FALLBACK_RULE,
    FLAG_FILE,
    ROUTING_FLAG_FILE,
    SPEEDUP,
    Timeline,
)
from specguard.rules.durations import format_duration
from specguard.rules.signals import get_signal
from specguard.sim.server import Simulator
from specguard.sim.slack_api import SlackApi
from specguard.sim.traffic import Traffic
from specguard.store.records import ActionRun, EventRecord

NAME_WIDTH = 24  # the longest shipped rule name, speculation_unprofitable


def slack_lines(blocks: Sequence[dict[str, Any]] | None, text: str | None) -> list[str]:
    """A Slack message's blocks as plain lines, roughly as Slack shows them."""
    lines: list[str] = []
    for block in blocks or ():
        if block.get("type") == "header":
            lines.append(block["text"]["text"])
        if block.get("type") == "section" and "text" in block:
            lines.extend(_plain(block["text"]["text"]).splitlines())
        if block.get("fields"):
            pairs = [_plain(f["text"]).split("\n", 1) for f in block["fields"]]
            lines.append(" | ".join(f"{p[0]}: {p[1] if len(p) > 1 else ''}" for p in pairs))
        for element in block.get("elements", ()):
            lines.append(_plain(element.get("text", "")))
    return lines or [text or ""]


def _plain(mrkdwn: str) -> str:
    text = re.sub(r"<([^|>]+)\|([^>]+)>", r"\2 (\1)", mrkdwn)
    text = re.sub(r":[a-z_]+: ", "", text).replace("*", "")
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@dataclass
class DemoRun:
    terminal: Terminal
    directory: Path
    timeline: Timeline
    fired: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)  # what happened when, seconds from start
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # the loop is complete
    routing: dict[str, Any] | None = None  # the routing: section, while nginx routes
    router_said: str = ""  # which router, and why
    pool_names: dict[str, str] = field(default_factory=dict)  # a server URL's pool (the demo's own router)
    routed: Counter[str] | None = None  # nginx's own count of requests per pool, at the end

    def pool(self, server: str) -> str:
        """The pool a request was served by (Served.server: nginx's X-Specguard-Pool or a URL)."""
        return self.pool_names.get(server, server)

    def mark(self, what: str) -> None:
        self.marks.setdefault(what, self.terminal.now())

    def on_event(self, item: LoadedRule, record: EventRecord) -> None:
        event = record.event
        t = self.terminal
        arrow = f"{event.previous.value} -> {event.kind.value}"
        value = "no data" if event.value is None else f"{event.value:.3g}"
        if item.rule.detect is not None:  # a detector's value is its evidence, not acceptance
            h = "?" if event.threshold is None else f"{event.threshold:.3g}"
            text = f"{event.rule:<{NAME_WIDTH}} {arrow:<20} CUSUM G = {value} (h = {h})"
        else:
            text = f"{event.rule:<{NAME_WIDTH}} {arrow:<20} {item.rule.signal} = {value} ({item.rule.test})"
        if event.kind.value == "firing":
            self.fired.setdefault(event.rule, t.now())
            t.line(text, "bold", "red")
        elif event.kind.value == "pending":
            t.line(text, "yellow")
        else:
            t.line(text, "green" if event.kind.value == "resolved" else "dim")
        if event.rule == FALLBACK_RULE and event.kind.value in ("firing", "resolved"):
            self.mark(f"rule {event.kind.value}")
        for run in record.runs:
            if run.status in ("skipped", "deferred"):
                t.detail(f"action {run.action}: {run.status} ({run.reason})", "dim")
        if event.rule == FALLBACK_RULE and event.kind.value == "resolved":
            # the flag's controller restores it once nothing has fired for its quiet period
            t.detail(f"action fallback (restore): once nothing fires for "
                     f"{format_duration(self.timeline.quiet_period)}, and the canary agrees", "dim")  # fmt: skip

    def on_run(self, run: ActionRun, status: str, detail: str) -> None:
        name = run.action + (" (restore)" if run.mode == "restore" else "")
        style = "dim" if run.action == "log" else ("green" if status == "ok" else "yellow")
        self.terminal.line(f"action {name}: {status}: {detail}", style)
        if run.action == "fallback" and status == "ok":
            self.mark("flag restored" if run.mode == "restore" else "flag engaged")
        if run.action == "fallback" and run.mode == "restore" and status != "ok":
            self.mark("canary held the fallback")

    def on_route(self, speculative: bool, server: str) -> None:
        """The demo's own router read the flag file and moved the traffic."""
        said = f"{FLAG_FILE} says speculative: {'true' if speculative else 'false'} ->"
        self._moved(speculative, said, "" if speculative else f" ({server})")

    def on_pool(self, pool: str) -> None:
        """nginx sends new requests to ``pool`` (as their answers' X-Specguard-Pool says)."""
        self._moved(pool == "speculative", "nginx sends", f" (X-Specguard-Pool: {pool})")

    def _moved(self, back: bool, said: str, detail: str) -> None:
        self.mark("traffic back" if back else "traffic moved")
        where = "back to speculative decoding" if back else "to standard decoding"
        self.terminal.line(f"router: {said} traffic {where}{detail}", "bold", "green")

    def on_slack(self, kind: str, message: dict[str, Any]) -> None:
        t = self.terminal
        lines = slack_lines(message.get("blocks"), message.get("text"))
        if kind == "update":
            t.line(f"Slack {CHANNEL}: the thread's first message was edited:", "cyan")
            if lines and lines[0].startswith("RESOLVED") and any("fallback (restore)" in x for x in lines):
                self.mark("Slack thread resolved")
                self.closed.set()
        elif message.get("thread_ts"):
            t.line(f"Slack {CHANNEL}: a reply in the thread:", "cyan")
        else:
            self.mark("Slack posted")
            t.line(f"Slack {CHANNEL} received a message:", "cyan")
        for line in lines:
            t.detail(f"| {line}", "cyan")


async def pulse(run: DemoRun, daemon: Daemon, traffic: Traffic) -> None:
    """A status line every few seconds: acceptance as specguard reads it from the speculative
    server, and the latency the router's clients saw."""
    every = run.timeline.pulse_every
    while True:
        await asyncio.sleep(every)
        result = await daemon.source.query_signal(get_signal("acceptance_rate"), 3.0, ())
        value = result.series[0].value if result.series else None
        acceptance = "acceptance - (no traffic)" if value is None else f"acceptance {value:.2f}"
        p95 = traffic.latency(time.monotonic() - every)
        latency = "-" if p95 is None else f"{p95:.2f}s"
        share = sum(1 for s in traffic.served if s.finished >= time.monotonic() - every)
        on_spec = sum(
            1
            for s in traffic.served
            if s.finished >= time.monotonic() - every and run.pool(s.server) == "speculative"
        )
        run.terminal.line(
            f"pulse: {acceptance}, clients' p95 {latency}, "
            f"{on_spec}/{share} requests on speculative decoding",
            "dim",
        )


def print_banner(
    t: Terminal,
    spec: Simulator,
    standard: Simulator,
    daemon: Daemon,
    slack: SlackApi,
    directory: Path,
    routing: dict[str, Any] | None,
    version: str,
) -> None:
    if routing is not None:
        router = (f"http://{routing['listen']}  nginx {version}, specguard's Lua router "
                  f"(flag and metrics on http://{routing['admin_listen']})")  # fmt: skip
    else:
        router = f"the demo's own: sends each request where {directory / FLAG_FILE} says"
    t.line("specguard demo: a simulated vLLM 0.32 with speculative decoding, guarded by specguard",
           "bold", stamp=False)  # fmt: skip
    t.line(stamp=False)
    rows = (
        ("speculative", f"{spec.url}  simulated vLLM, draft model, k=4 (specguard watches it)"),
        ("standard", f"{standard.url}  simulated vLLM, no speculative decoding (the fallback)"),
        ("router", router),
        ("specguard", f"http://127.0.0.1:{daemon.port}  the shipped rules, windows and durations "
                      f"shortened {SPEEDUP}x; {FALLBACK_RULE} runs fallback and oncall"),
        ("slack", f"{slack.url}  a Slack Web API on loopback (channel {CHANNEL})"),
        ("files", str(directory)),
    )  # fmt: skip
    for name, text in rows:
        t.line(f"  {name:<11} {text}", stamp=False)
    t.line(stamp=False)


def _phases(run: DemoRun, traffic: Traffic, end: float) -> list[tuple[str, float | None]]:
    """Clients' p95 latency in each phase of the loop, of the requests that started and ended in it
    (a request is sent where the router says when it starts: one started before the traffic moved
    is still on the pool it left)."""
    marks, started = run.marks, run.terminal.started
    bounds = [
        ("healthy", 3.0, marks.get("acceptance drops")),
        ("collapsed", marks.get("acceptance drops") or end, marks.get("traffic moved")),
        ("on the fallback", marks.get("traffic moved") or end, marks.get("traffic back")),
        ("restored", marks.get("traffic back") or end, end),
    ]
    out: list[tuple[str, float | None]] = []
    for name, since, until in bounds:
        if until is None or until <= since:
            out.append((name, None))
            continue
        out.append((name, traffic.latency(started + since, started + until, whole=True)))
    return out


def print_summary(
    t: Terminal,
    run: DemoRun,
    status: list[dict[str, Any]],
    traffic: Traffic,
    thread: list[dict[str, Any]],
    interrupted: bool,
    closed: bool,
) -> None:
    directory = run.directory
    t.line(stamp=False)
    if interrupted:
        t.line("interrupted: everything stopped cleanly", "bold", stamp=False)
    else:
        t.line("summary" if closed else "summary (the loop did not close)", "bold", stamp=False)
    order = ["acceptance drops", "rule firing", "flag engaged", "traffic moved", "Slack posted",
             "temperature normal", "rule resolved", "canary held the fallback", "flag restored",
             "traffic back", "Slack thread resolved"]  # fmt: skip
    t.line("  the loop", stamp=False)
    for what in order:
        if what in run.marks:
            t.line(f"    {run.marks[what]:5.0f}s  {what}", stamp=False)
    latencies = ", ".join(
        f"{name} {'-' if value is None else f'{value:.2f}s'}"
        for name, value in _phases(run, traffic, t.now())
    )
    t.line(f"  latency   clients' p95: {latencies}", stamp=False)
    t.line("  rules", stamp=False)
    for row in status:
        fired = run.fired.get(row["rule"])
        when = f"fired at {fired:.0f}s" if fired is not None else "did not fire"
        t.line(f"    {row['rule']:<{NAME_WIDTH}} {row['state']:<9} {when}", stamp=False)
    stats = traffic.stats
    pools: Counter[str] = Counter()
    for server, count in stats.by_server.items():
        pools[run.pool(server)] += count
    told = (
        "as each answer's X-Specguard-Pool header says" if run.routing else "as the demo's router sent them"
    )
    t.line(
        f"  traffic   {stats.requests} requests: {pools['speculative']} on speculative decoding, "
        f"{pools['standard']} on standard decoding ({told}); {stats.tokens} tokens, {stats.errors} errors",
        stamp=False,
    )
    if run.routing is not None:
        counted = "-" if run.routed is None else ", ".join(f"{p} {n}" for p, n in sorted(run.routed.items()))
        t.line(f"  nginx     requests routed by pool, its /specguard/metrics: {counted}", stamp=False)
    parents = [m for m in thread if not m.get("thread_ts")]
    for parent in parents:
        replies = [m for m in thread if m.get("thread_ts") == parent["ts"]]
        t.line(f"  Slack     the thread in {CHANNEL} as on-call sees it now "
               f"(first message edited {parent['edits']} times, {len(replies)} replies):", stamp=False)  # fmt: skip
        for line in slack_lines(parent.get("blocks"), parent.get("text")):
            t.line(f"            | {line}", stamp=False)
        for reply in replies:
            t.line(f"            |   > {reply.get('text', '')}", stamp=False)
    t.line(stamp=False)
    t.line(
        f"  state     {directory / 'specguard.db'}   (SQLite: rule states, events, action runs)", stamp=False
    )
    t.line(f"  log       {directory / 'specguard.log'}  (the daemon's JSON log)", stamp=False)
    if run.routing is not None:
        t.line(f"  flag      http://{run.routing['admin_listen']}/specguard/flag, and "
               f"{directory / ROUTING_FLAG_FILE} (which nginx reads when it starts)", stamp=False)  # fmt: skip
        t.line(f"  router    {directory / 'nginx'}: nginx.conf and the rendered router; logs/access.log "
               "(each request's class= and pool=)", stamp=False)  # fmt: skip
    else:
        t.line(f"  flag      {directory / FLAG_FILE} (and {FLAG_FILE}.prev, the version before)", stamp=False)
    t.line(f"  config    {directory / 'specguard.yaml'}, rules.yaml, baseline.json", stamp=False)
    t.line(f"  try       specguard history --config {directory / 'specguard.yaml'}", stamp=False)
    t.line(f"            specguard check --config {directory / 'specguard.yaml'}", stamp=False)
