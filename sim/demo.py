"""`specguard demo`: the simulator and the daemon together, end to end, in about a minute.

A simulated vLLM with speculative decoding (draft model, k = 4) serves steady traffic; specguard
watches it with the shipped rules, their windows shortened 20 times. specguard measures a latency
baseline and reloads its config with it. Then the traffic moves to a high sampling temperature,
acceptance collapses, latency climbs and later the KV cache fills. The terminal shows each rule going
pending -> firing, the actions taken, and the Slack message on-call would get.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from daemon import logs
from daemon.loading import LoadedRule, builtin_pack, load
from daemon.runtime import Daemon
from daemon.store import ActionRun, EventRecord
from rules.durations import format_duration, parse_duration
from rules.signals import get_signal
from sim.options import SimOptions, SpeculativeConfig
from sim.server import Simulator, start_simulator
from sim.traffic import Traffic

SPEEDUP = 20  # the shipped rules' windows and durations are divided by this
NAME_WIDTH = 24  # the longest shipped rule name, speculation_unprofitable
MODEL = "tiny-llama"
HEALTHY_TEMPERATURE = 0.0
HOT_TEMPERATURE = 1.5


@dataclass(frozen=True)
class Timeline:
    """When things happen, in seconds from the start."""

    baseline_at: float = 14.0
    degrade_at: float = 18.0
    kv_ramp_at: float = 42.0
    kv_ramp_seconds: float = 5.0
    deadline: float = 80.0  # stop here even if a rule has not fired
    pulse_every: float = 5.0


class Terminal:
    """Plain lines with optional colour; readable when piped or on a dumb terminal."""

    CODES = {"dim": "2", "bold": "1", "red": "31", "yellow": "33", "green": "32", "cyan": "36"}

    def __init__(self, out: TextIO, color: bool):
        self.out = out
        self.color = color
        self.started = time.monotonic()

    def style(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(self.CODES[s] for s in styles)
        return f"\033[{codes}m{text}\033[0m"

    def line(self, text: str = "", *styles: str, stamp: bool = True) -> None:
        prefix = f"[{time.monotonic() - self.started:4.0f}s] " if stamp else ""
        self.out.write(prefix + self.style(text, *styles) + "\n")
        self.out.flush()

    def detail(self, text: str, *styles: str) -> None:
        self.out.write("        " + self.style(text, *styles) + "\n")
        self.out.flush()


def scaled_rules(factor: int) -> dict[str, Any]:
    """The shipped pack with every window and duration divided by ``factor``."""
    pack = yaml.safe_load(builtin_pack("speculative").read_text())
    for rule in pack["rules"]:
        for key in ("window", "for", "keep_firing_for", "interval"):
            if key in rule:
                seconds = max(1.0, parse_duration(rule[key]) / factor)
                rule[key] = format_duration(seconds)
    return dict(pack)


def slack_preview(record: EventRecord, labels: dict[str, str]) -> list[str]:
    """The message on-call would get (Slack is not configured in the demo)."""
    event = record.event
    head = "RESOLVED" if event.kind.value == "resolved" else record.severity.upper()
    where = labels.get("instance", "all instances")
    value = "no data" if event.value is None else f"{event.value:.3g}"
    return [
        f"[{head}] {event.rule} {event.kind.value} on {where}",
        record.summary,
        f"value {value} | threshold {event.threshold:.3g} | model {labels.get('model_name', '-')}",
    ]


@dataclass
class DemoRun:
    terminal: Terminal
    directory: Path
    timeline: Timeline
    fired: dict[str, float] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def on_event(self, item: LoadedRule, record: EventRecord) -> None:
        event = record.event
        t = self.terminal
        arrow = f"{event.previous.value} -> {event.kind.value}"
        value = "no data" if event.value is None else f"{event.value:.3g}"
        text = f"{event.rule:<{NAME_WIDTH}} {arrow:<20} {item.rule.signal} = {value} ({item.rule.test})"
        if event.kind.value == "firing":
            self.fired.setdefault(event.rule, time.monotonic() - t.started)
            t.line(text, "bold", "red")
        elif event.kind.value == "pending":
            t.line(text, "yellow")
        else:
            t.line(text, "green" if event.kind.value == "resolved" else "dim")
        for run in record.runs:
            if run.status == "skipped":
                t.detail(f"action {run.action}: skipped ({run.reason})", "dim")
        if event.kind.value in ("firing", "resolved"):
            t.detail("Slack (not configured) would post to on-call:", "cyan")
            for line in slack_preview(record, dict(event.labels)):
                t.detail(f"  | {line}", "cyan")

    def on_run(self, run: ActionRun, status: str, detail: str) -> None:
        self.terminal.detail(f"action {run.action}: {status} ({detail})", "dim")


async def _pulse(run: DemoRun, daemon: Daemon, traffic: Traffic) -> None:
    """A status line every few seconds, computed by specguard's own source."""
    queries = {"acceptance": ("acceptance_rate", 3.0), "e2e p95": ("e2e_latency_p95", 5.0),
               "kv": ("kv_cache_usage", 3.0)}  # fmt: skip
    while True:
        await asyncio.sleep(run.timeline.pulse_every)
        parts = []
        for label, (signal_name, window) in queries.items():
            result = await daemon.source.query_signal(get_signal(signal_name), window, ())
            value = result.series[0].value if result.series else None
            if value is None:
                parts.append(f"{label} -")
            elif signal_name == "kv_cache_usage":
                parts.append(f"{label} {value:.0%}")
            elif signal_name == "e2e_latency_p95":
                parts.append(f"{label} {value:.2f}s")
            else:
                parts.append(f"{label} {value:.2f}")
        stats = traffic.stats
        parts.append(f"{stats.requests} requests served")
        run.terminal.line("pulse: " + ", ".join(parts), "dim")


async def _kv_ramp(sim: Simulator, to: float, seconds: float) -> None:
    steps = 10
    for i in range(1, steps + 1):
        sim.engine.set_kv_usage_floor(to * i / steps)
        await asyncio.sleep(seconds / steps)


def _write_config(directory: Path, sim_url: str, baseline: bool) -> Path:
    config = {
        "server": {"port": 0},
        "interval": "1s",
        "state_dir": ".",
        "sources": {"scrape": {"targets": [f"{sim_url}/metrics"], "timeout": "2s"}},
        "rules": ["rules.yaml"],
    }
    if baseline:
        config["baseline"] = "baseline.json"
    path = directory / "specguard.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def _measure_baseline(
    daemon: Daemon, directory: Path, window: float, draft_cost: float
) -> float | None:
    result = await daemon.source.query_signal(get_signal("e2e_latency_p95"), window, ())
    if not result.series:
        return None
    value = result.series[0].value
    baseline = {
        "version": 2,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "method": f"specguard demo: e2e p95 over {window:g}s of healthy simulated traffic",
        "entries": [
            {
                "model": MODEL,
                "signals": {"e2e_latency_p95": value},
                # The simulated draft's cost per step, as the simulator was told (--draft-cost).
                "speculative": {"method": "draft_model", "draft_cost": draft_cost},
            }
        ],
    }
    (directory / "baseline.json").write_text(json.dumps(baseline, indent=2) + "\n")
    return value


async def run_demo(directory: Path, out: TextIO, color: bool, timeline: Timeline | None = None) -> int:
    timeline = timeline or Timeline()
    directory.mkdir(parents=True, exist_ok=True)
    t = Terminal(out, color)
    run = DemoRun(t, directory, timeline)
    log_file = (directory / "specguard.log").open("a", encoding="utf-8")
    logs.setup("json", "info", stream=log_file)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.stop.set)

    options = SimOptions(
        model=MODEL,
        port=0,
        speculative=SpeculativeConfig(method="draft_model", model="tiny-draft", num_speculative_tokens=4),
        acceptance_by_position=[0.85],
        temperature_decay=1.2,
        step_time=0.03,
        seed=7,
    )
    sim = await start_simulator(options)
    (directory / "rules.yaml").write_text(yaml.safe_dump(scaled_rules(SPEEDUP), sort_keys=False))
    config_path = _write_config(directory, sim.url, baseline=False)
    loaded = load(config_path)
    if not loaded.ok:  # the demo writes these files itself: this is a bug, say so plainly
        for problem in loaded.errors:
            t.line(f"demo config problem: {problem}", "red")
        await sim.stop()
        return 1
    daemon = Daemon(loaded, config_path)
    daemon.on_event.append(run.on_event)
    daemon.dispatcher.on_run.append(run.on_run)
    traffic = Traffic(sim.url, MODEL, concurrency=4, max_tokens=64, temperature=HEALTHY_TEMPERATURE)
    tasks: list[asyncio.Task[Any]] = []
    interrupted = False
    try:
        await daemon.start(handle_signals=False)
        _banner(t, sim, daemon, directory)
        await traffic.start()
        t.line(f"traffic: 4 concurrent streams at temperature {HEALTHY_TEMPERATURE:g}")
        tasks.append(asyncio.create_task(_pulse(run, daemon, traffic)))

        steps: list[tuple[float, Callable[[], Any]]] = [
            (timeline.baseline_at, lambda: _baseline_step(run, daemon, config_path, sim)),
            (timeline.degrade_at, lambda: _degrade_step(run, traffic)),
            (timeline.kv_ramp_at, lambda: _kv_step(run, sim, tasks)),
        ]
        for at, step in steps:
            if await _sleep_until(run, at):
                interrupted = True
                break
            await step()
        if not interrupted:
            interrupted = await _wait_for_all_rules(run, daemon)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await traffic.stop()
        summary = daemon.rule_rows()
        await daemon.shutdown()
        await sim.stop()
        log_file.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    _summary(t, run, summary, directory, traffic, interrupted)
    return 130 if interrupted else 0


async def _sleep_until(run: DemoRun, at: float) -> bool:
    """Wait until ``at`` seconds after the start; True if the demo was interrupted."""
    remaining = at - (time.monotonic() - run.terminal.started)
    if remaining <= 0:
        return run.stop.is_set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.stop.wait(), timeout=remaining)
    return run.stop.is_set()


async def _wait_for_all_rules(run: DemoRun, daemon: Daemon) -> bool:
    names = {r.name for r in daemon.loaded.enabled_rules()}
    while not names <= run.fired.keys():
        elapsed = time.monotonic() - run.terminal.started
        if elapsed >= run.timeline.deadline:
            return False
        if await _sleep_until(run, min(elapsed + 0.5, run.timeline.deadline)):
            return True
    return await _sleep_until(run, time.monotonic() - run.terminal.started + 1.0)


async def _baseline_step(run: DemoRun, daemon: Daemon, config_path: Path, sim: Simulator) -> None:
    t = run.terminal
    window = run.timeline.baseline_at - 2
    value = await _measure_baseline(daemon, run.directory, window, sim.options.draft_cost)
    if value is None:
        t.line("baseline: no latency data yet; latency_regression will report an error", "red")
        return
    _write_config(run.directory, sim.url, baseline=True)
    reloaded = await daemon.reload()
    t.line(
        f"baseline measured: e2e p95 {value:.2f}s -> baseline.json; config reloaded ({'ok' if reloaded else 'failed'})"
    )
    t.detail(f"latency_regression now fires above 1.2 x {value:.2f}s = {1.2 * value:.2f}s", "dim")
    t.detail(
        f"speculation_unprofitable now knows the draft's cost per step: c = {sim.options.draft_cost:g}", "dim"
    )


async def _degrade_step(run: DemoRun, traffic: Traffic) -> None:
    traffic.temperature = HOT_TEMPERATURE
    run.terminal.line(
        f"traffic moves to temperature {HOT_TEMPERATURE:g}: the draft model's guesses stop matching",
        "bold",
    )


async def _kv_step(run: DemoRun, sim: Simulator, tasks: list[asyncio.Task[Any]]) -> None:
    run.terminal.line("long prompts arrive: the KV cache fills towards 97%", "bold")
    tasks.append(asyncio.create_task(_kv_ramp(sim, 0.97, run.timeline.kv_ramp_seconds)))


def _banner(t: Terminal, sim: Simulator, daemon: Daemon, directory: Path) -> None:
    t.line(
        "specguard demo: a simulated vLLM 0.32 with speculative decoding, watched by specguard",
        "bold",
        stamp=False,
    )
    t.line(stamp=False)
    t.line(f"  simulator  {sim.url}  (OpenAI API, /metrics, /health; draft model, k=4)", stamp=False)
    t.line(f"  specguard  http://127.0.0.1:{daemon.port}  (/api/status, /metrics, /healthz)", stamp=False)
    t.line(f"  rules      the shipped pack, windows and durations shortened {SPEEDUP}x", stamp=False)
    t.line(f"  files      {directory}", stamp=False)
    t.line(stamp=False)


def _summary(
    t: Terminal,
    run: DemoRun,
    status: list[dict[str, Any]],
    directory: Path,
    traffic: Traffic,
    interrupted: bool,
) -> None:
    t.line(stamp=False)
    t.line("interrupted: everything stopped cleanly" if interrupted else "summary", "bold", stamp=False)
    for row in status:
        fired = run.fired.get(row["rule"])
        when = f"fired at {fired:.0f}s" if fired is not None else "did not fire"
        t.line(f"  {row['rule']:<{NAME_WIDTH}} {row['state']:<9} {when}", stamp=False)
    t.line(
        f"  traffic: {traffic.stats.requests} requests, {traffic.stats.tokens} tokens, "
        f"{traffic.stats.errors} errors",
        stamp=False,
    )
    t.line(stamp=False)
    t.line(
        f"  state     {directory / 'specguard.db'}   (SQLite: rule states, events, action runs)", stamp=False
    )
    t.line(f"  log       {directory / 'specguard.log'}  (the daemon's JSON log)", stamp=False)
    t.line(f"  config    {directory / 'specguard.yaml'}, rules.yaml, baseline.json", stamp=False)
    t.line(f"  try       specguard check --config {directory / 'specguard.yaml'}", stamp=False)
    t.line(f"            specguard history --config {directory / 'specguard.yaml'}", stamp=False)


def main(state_dir: Path | None, color: bool | None) -> int:
    directory = state_dir or Path(tempfile.mkdtemp(prefix="specguard-demo-"))
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return asyncio.run(run_demo(directory, sys.stdout, color))
