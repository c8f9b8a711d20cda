"""`specguard demo`: the simulator, the daemon and its real actions, end to end, in about a minute.

A simulated vLLM with speculative decoding (draft model, k = 4) serves steady traffic through a
router that reads a feature-flag file, as a real router would; a second simulated vLLM, without
speculative decoding, stands by. specguard watches the speculative server with the shipped rules,
their windows shortened 20 times, measures a latency baseline and reloads its config with it.

Then the traffic moves to a high sampling temperature and acceptance collapses. The terminal shows
the loop as it happens: the rule fires, the ``feature_flag`` action writes the flag file, the
router sends traffic to standard decoding and latency improves, the temperature returns to normal,
the rule resolves, and after the quiet period the canary sees acceptance back, the flag is
restored and traffic returns. The ``slack`` action tells on-call in a thread on a Slack Web API
served on loopback; the demo prints what that server received.

Once the loop has closed, the demo writes specguard's report of its minutes (HTML, and Markdown
with its charts beside it) from the history the daemon recorded at each scrape, and prints its
headline figures and where the files are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from specguard.common import logs
from specguard.config.loading import LoadedRule, builtin_pack, load
from specguard.daemon.runtime import Daemon
from specguard.demo.calibration import wait_calibrated
from specguard.demo.report import MODEL, Terminal, report_section
from specguard.report import weekly
from specguard.rules.durations import format_duration, parse_duration
from specguard.rules.signals import get_signal
from specguard.sim.flag_router import FlagRouter
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.slack_api import TOKEN, SlackApi, running
from specguard.sim.traffic import Traffic
from specguard.sources.targets import instance_label
from specguard.store.baseline import Baseline
from specguard.store.database import ActionRun, EventRecord
from specguard.store.history import MINUTE

SPEEDUP = 20  # the shipped rules' windows and durations are divided by this
NAME_WIDTH = 24  # the longest shipped rule name, speculation_unprofitable
HEALTHY_TEMPERATURE = 0.0
HOT_TEMPERATURE = 1.5
CHANNEL = "C0DEMO0NCALL"
FALLBACK_RULE = "acceptance_fallback"
DETECTOR_RULE = "acceptance_collapse"
DETECTOR_WARMUP = 10.0  # seconds of healthy traffic the detector calibrates on
FLAG_FILE = "flag.json"
# The simulated draft's cost per step against the target's (c): a small draft model's. With it,
# healthy speculation is about twice as fast as standard decoding and collapsed speculation about a
# third slower, so the fallback shows in the latency clients see.
DRAFT_COST = 0.15


@dataclass(frozen=True)
class Timeline:
    """When things happen, in seconds from the start (or from the step before)."""

    baseline_at: float = 14.0
    degrade_at: float = 18.0
    calm_after: float = 5.0  # the temperature returns to normal this long after traffic moved away
    quiet_period: float = 8.0  # the fallback's: resolved this long before the canary and restore
    linger: float = 4.0  # after the loop has closed, to show traffic back on speculation
    calibration_wait: float = 30.0  # the drop waits this long at most for the detector's calibration
    deadline: float = 110.0  # stop here even if the loop has not closed
    pulse_every: float = 5.0


def scaled_rules(factor: int) -> dict[str, Any]:
    """The shipped pack with every window and duration divided by ``factor``; the fallback rule
    engages the flag and tells on-call, and resolves once its server has no traffic to judge."""
    pack = yaml.safe_load(builtin_pack("speculative").read_text())
    for rule in pack["rules"]:
        for key in ("window", "for", "keep_firing_for", "interval"):
            if key in rule:
                seconds = max(1.0, parse_duration(rule[key]) / factor)
                rule[key] = format_duration(seconds)
        if rule["name"] == FALLBACK_RULE:
            rule["actions"] = ["log", "fallback", "oncall"]
            rule["no_data"] = "ok"
        if rule["name"] == DETECTOR_RULE:
            # Its hour of warm-up, shortened to the demo's healthy seconds; it only logs, beside
            # the playbook rule that drives the fallback, to show how much sooner it sees the drop.
            rule["detect"]["warmup"] = format_duration(DETECTOR_WARMUP)
            rule["detect"]["min_trials"] = 20
    return dict(pack)


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
        t = self.terminal
        if speculative:
            self.mark("traffic back")
            t.line(f"router: {FLAG_FILE} says speculative: true -> traffic back to speculative decoding",
                   "bold", "green")  # fmt: skip
        else:
            self.mark("traffic moved")
            t.line(f"router: {FLAG_FILE} says speculative: false -> traffic to standard decoding ({server})",
                   "bold", "green")  # fmt: skip

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


async def _pulse(run: DemoRun, daemon: Daemon, traffic: Traffic, speculative: str) -> None:
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
            1 for s in traffic.served if s.finished >= time.monotonic() - every and s.server == speculative
        )
        run.terminal.line(
            f"pulse: {acceptance}, clients' p95 {latency}, "
            f"{on_spec}/{share} requests on speculative decoding",
            "dim",
        )


def _write_config(directory: Path, spec_url: str, slack: SlackApi, quiet: float, baseline: bool) -> Path:
    config: dict[str, Any] = {
        "server": {"port": 0},
        "interval": "1s",
        "state_dir": ".",
        "sources": {"scrape": {"targets": [f"{spec_url}/metrics"], "timeout": "2s"}},
        "rules": ["rules.yaml"],
        "actions": {
            "fallback": {
                "type": "feature_flag",
                "file": {
                    "path": FLAG_FILE,
                    "engage": {"speculative": False},
                    "restore": {"speculative": True},
                },
                "quiet_period": format_duration(quiet),
                "canary": {
                    "url": spec_url,
                    "min_acceptance": 0.5,
                    "requests": 4,
                    "max_tokens": 32,
                    "temperature": HEALTHY_TEMPERATURE,
                    "timeout": "20s",
                },
                "restore_backoff": "4s",
            },
            "oncall": {
                "type": "slack",
                "token": {"file": "slack-token"},
                "channel": CHANNEL,
                "base_url": slack.url,
                "group_wait": "2s",
            },
        },
    }
    if baseline:
        config["baseline"] = "baseline.json"
    path = directory / "specguard.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def _measure_baseline(
    daemon: Daemon, directory: Path, window: float, draft_cost: float
) -> float | None:
    signals: dict[str, float] = {}
    for name in ("e2e_latency_p95", "e2e_latency_mean"):  # what latency_regression and _mean_ read
        result = await daemon.source.query_signal(get_signal(name), window, ())
        if not result.series or result.series[0].value is None:
            return None
        signals[name] = result.series[0].value
    value = signals["e2e_latency_p95"]
    baseline = {
        "version": 2,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "method": f"specguard demo: e2e p95 and mean over {window:g}s of healthy simulated traffic",
        "entries": [
            {
                "model": MODEL,
                "signals": signals,
                "signals_from": "vllm_metrics",  # the daemon's own reading of vLLM's histogram
                # The simulated draft's cost per step, as the simulator was told (--draft-cost).
                "speculative": {"method": "draft_model", "draft_cost": draft_cost},
            }
        ],
    }
    (directory / "baseline.json").write_text(json.dumps(baseline, indent=2) + "\n")
    return value


def _prepare(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    # The router's flag file, as a deploy would leave it: speculative decoding on.
    (directory / FLAG_FILE).write_text(json.dumps({"speculative": True}) + "\n")
    token = directory / "slack-token"  # the bot token, read from a file as in production
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    (directory / "rules.yaml").write_text(yaml.safe_dump(scaled_rules(SPEEDUP), sort_keys=False))


async def run_demo(directory: Path, out: TextIO, color: bool, timeline: Timeline | None = None) -> int:
    timeline = timeline or Timeline()
    began = time.time()  # the report covers the demo from the start of this minute
    _prepare(directory)
    run = DemoRun(Terminal(out, color), directory, timeline)
    # The daemon's log, open until the report is written (matplotlib logs through it too).
    with (directory / "specguard.log").open("a", encoding="utf-8") as log_file:
        logs.setup("json", "info", stream=log_file)
        return await _run(run, began)


async def _run(run: DemoRun, began: float) -> int:
    t, directory, timeline = run.terminal, run.directory, run.timeline
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.stop.set)

    spec = await start_simulator(
        SimOptions(
            model=MODEL,
            port=0,
            step_time=0.03,
            draft_cost=DRAFT_COST,
            speculative=SpeculativeConfig(method="draft_model", model="tiny-draft", num_speculative_tokens=4),
            acceptance_by_position=[0.85],
            temperature_decay=1.2,
            seed=7,
        )
    )
    standard = await start_simulator(SimOptions(model=MODEL, port=0, step_time=0.03, seed=8))
    interrupted = closed = False
    baseline: Baseline | None = None
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with running() as slack:
            slack.listeners.append(run.on_slack)
            config_path = _write_config(directory, spec.url, slack, timeline.quiet_period, baseline=False)
            loaded = load(config_path)
            if not loaded.ok:  # the demo writes these files itself: this is a bug, say so plainly
                for problem in loaded.errors:
                    t.line(f"demo config problem: {problem}", "red")
                return 1
            daemon = Daemon(loaded, config_path, reports=weekly)
            daemon.on_event.append(run.on_event)
            daemon.dispatcher.on_run.append(run.on_run)
            router = FlagRouter(directory / FLAG_FILE, spec.url, standard.url, run.on_route)
            traffic = Traffic(
                spec.url, MODEL, concurrency=4, max_tokens=64, temperature=HEALTHY_TEMPERATURE, route=router
            )
            try:
                await daemon.start(handle_signals=False)
                _banner(t, spec, standard, daemon, slack, directory)
                await traffic.start()
                t.line(
                    f"traffic: 4 concurrent streams at temperature {HEALTHY_TEMPERATURE:g}, through the router"
                )
                tasks.append(asyncio.create_task(_pulse(run, daemon, traffic, spec.url)))
                interrupted, closed = await _script(run, daemon, traffic, config_path, spec, slack)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await traffic.stop()
                summary = daemon.rule_rows()
                baseline = daemon.loaded.baseline  # the measured one, after the reload
                await daemon.shutdown()
            thread = [dict(m) for m in slack.posted()]
    finally:
        await spec.stop()
        await standard.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    _summary(t, run, summary, traffic, spec.url, thread, interrupted, closed)
    if interrupted:
        return 130
    if not closed:
        return 1
    # The daemon has stopped and closed its store: the report opens it again. History is kept by
    # whole minutes, each under its start, so the period begins at the start of the first one.
    period = (began // MINUTE * MINUTE, time.time())
    remedies = [name for name, action in daemon.loaded.actions.items() if action.changes_world]
    written = await report_section(t, daemon.store.path, period, baseline, instance_label(spec.url), remedies)
    return 0 if written else 1


async def _script(
    run: DemoRun, daemon: Daemon, traffic: Traffic, config_path: Path, spec: Simulator, slack: SlackApi
) -> tuple[bool, bool]:
    """The demo's steps; (interrupted, the loop closed)."""
    t, timeline = run.terminal, run.timeline
    if await _sleep_until(run, timeline.baseline_at):
        return True, False
    await _baseline_step(run, daemon, config_path, spec, slack)
    if await _sleep_until(run, timeline.degrade_at):
        return True, False
    calibration = await wait_calibrated(
        daemon, DETECTOR_RULE, instance_label(spec.url), timeline.calibration_wait, run.stop
    )
    if run.stop.is_set():
        return True, False
    if calibration.calibrated:
        waited = f" (the drop waited {calibration.waited:.0f}s for it)" if calibration.waited >= 1 else ""
        t.line(f"{DETECTOR_RULE} {calibration.text}{waited}", "dim")
    else:
        t.line(f"{DETECTOR_RULE} has not calibrated after {calibration.waited:.0f}s more ({calibration.text}): "
               "the drop goes ahead, and it may not see it", "red")  # fmt: skip
    traffic.temperature = HOT_TEMPERATURE
    run.mark("acceptance drops")
    t.line(
        f"traffic moves to temperature {HOT_TEMPERATURE:g}: the draft model's guesses stop matching", "bold"
    )
    # The temperature returns to normal a while after the router moved the traffic away.
    while "traffic moved" not in run.marks:
        if await _sleep_until(run, min(t.now() + 0.25, timeline.deadline)) or t.now() >= timeline.deadline:
            return run.stop.is_set(), False
    if await _sleep_until(run, run.marks["traffic moved"] + timeline.calm_after):
        return True, False
    traffic.temperature = HEALTHY_TEMPERATURE
    run.mark("temperature normal")
    t.line(
        f"the hot traffic ends: temperature back to {HEALTHY_TEMPERATURE:g} (served by standard decoding "
        "while the flag is engaged)",
        "bold",
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_either(run.closed, run.stop), timeout=max(0.0, timeline.deadline - t.now()))
    if run.stop.is_set():
        return True, run.closed.is_set()
    if not run.closed.is_set():
        t.line(f"the loop did not close within {timeline.deadline:g}s", "red")
        return False, False
    return await _sleep_until(run, t.now() + timeline.linger), True


async def _either(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def _sleep_until(run: DemoRun, at: float) -> bool:
    """Wait until ``at`` seconds after the start; True if the demo was interrupted."""
    remaining = at - run.terminal.now()
    if remaining <= 0:
        return run.stop.is_set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.stop.wait(), timeout=remaining)
    return run.stop.is_set()


async def _baseline_step(
    run: DemoRun, daemon: Daemon, config_path: Path, sim: Simulator, slack: SlackApi
) -> None:
    t = run.terminal
    window = run.timeline.baseline_at - 2
    value = await _measure_baseline(daemon, run.directory, window, sim.options.draft_cost)
    if value is None:
        t.line("baseline: no latency data yet; latency_regression will report an error", "red")
        return
    _write_config(run.directory, sim.url, slack, run.timeline.quiet_period, baseline=True)
    reloaded = await daemon.reload()
    t.line(
        f"baseline measured: e2e p95 {value:.2f}s -> baseline.json; config reloaded ({'ok' if reloaded else 'failed'})"
    )
    t.detail(f"latency_regression now fires above 1.2 x {value:.2f}s = {1.2 * value:.2f}s", "dim")
    t.detail(
        f"speculation_unprofitable now knows the draft's cost per step: c = {sim.options.draft_cost:g}", "dim"
    )


def _banner(
    t: Terminal, spec: Simulator, standard: Simulator, daemon: Daemon, slack: SlackApi, directory: Path
) -> None:
    t.line("specguard demo: a simulated vLLM 0.32 with speculative decoding, guarded by specguard",
           "bold", stamp=False)  # fmt: skip
    t.line(stamp=False)
    rows = (
        ("speculative", f"{spec.url}  simulated vLLM, draft model, k=4 (specguard watches it)"),
        ("standard", f"{standard.url}  simulated vLLM, no speculative decoding (the fallback)"),
        ("router", f"sends each request where {directory / FLAG_FILE} says"),
        ("specguard", f"http://127.0.0.1:{daemon.port}  the shipped rules, windows and durations "
                      f"shortened {SPEEDUP}x; {FALLBACK_RULE} runs fallback and oncall"),
        ("slack", f"{slack.url}  a Slack Web API on loopback (channel {CHANNEL})"),
        ("files", str(directory)),
    )  # fmt: skip
    for name, text in rows:
        t.line(f"  {name:<11} {text}", stamp=False)
    t.line(stamp=False)


def _phases(run: DemoRun, traffic: Traffic, end: float) -> list[tuple[str, float | None]]:
    """Clients' p95 latency in each phase of the loop (requests that started and ended in it)."""
    marks, started = run.marks, run.terminal.started
    bounds = [
        ("healthy", 3.0, marks.get("acceptance drops")),
        ("collapsed", (marks.get("acceptance drops") or end) + 3.0, marks.get("traffic moved")),
        ("on the fallback", (marks.get("traffic moved") or end) + 2.0, marks.get("traffic back")),
        ("restored", (marks.get("traffic back") or end) + 2.0, end),
    ]
    out: list[tuple[str, float | None]] = []
    for name, since, until in bounds:
        if until is None or until <= since:
            out.append((name, None))
            continue
        out.append((name, traffic.latency(started + since, started + until)))
    return out


def _summary(
    t: Terminal,
    run: DemoRun,
    status: list[dict[str, Any]],
    traffic: Traffic,
    spec_url: str,
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
    t.line(
        f"  traffic   {stats.requests} requests ({stats.by_server[spec_url]} on speculative decoding), "
        f"{stats.tokens} tokens, {stats.errors} errors",
        stamp=False,
    )
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
    t.line(f"  flag      {directory / FLAG_FILE} (and {FLAG_FILE}.prev, the version before)", stamp=False)
    t.line(f"  config    {directory / 'specguard.yaml'}, rules.yaml, baseline.json", stamp=False)
    t.line(f"  try       specguard history --config {directory / 'specguard.yaml'}", stamp=False)
    t.line(f"            specguard check --config {directory / 'specguard.yaml'}", stamp=False)


def main(state_dir: Path | None, color: bool | None) -> int:
    directory = state_dir or Path(tempfile.mkdtemp(prefix="specguard-demo-"))
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return asyncio.run(run_demo(directory, sys.stdout, color))
