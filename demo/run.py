"""`specguard demo`: the simulator, the daemon and its real actions, end to end, in about a minute.

A simulated vLLM with speculative decoding (draft model, k = 4) serves steady traffic through a
router; a second simulated vLLM, without speculative decoding, stands by. The router is specguard's
nginx router (``specguard routing render`` of the demo's ``routing:`` section) when nginx, its Lua
module and lua-cjson are installed, the ``feature_flag`` action setting its flag through the
``nginx`` backend; otherwise the demo's own, which reads a feature-flag file the ``file`` backend
writes, as a real router would (demo.routers). specguard watches the speculative server with the shipped rules,
their windows shortened 20 times, measures a latency baseline and reloads its config with it.

Then the traffic moves to a high sampling temperature and acceptance collapses. The terminal shows
the loop as it happens: the rule fires, the ``feature_flag`` action sets the flag, the
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
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from specguard.common import logs
from specguard.config.loading import load
from specguard.config.routing import RoutingConfig
from specguard.daemon.runtime import Daemon
from specguard.demo.calibration import wait_calibrated
from specguard.demo.narration import DemoRun, print_banner, print_summary, pulse
from specguard.demo.report import MODEL, Terminal, report_section
from specguard.demo.routers import NGINX_DIR, Choice, NginxRouter, PoolWatch, choose, find_nginx, free_ports
from specguard.demo.scenario import (
    DETECTOR_RULE,
    DRAFT_COST,
    FLAG_FILE,
    HEALTHY_TEMPERATURE,
    HOT_TEMPERATURE,
    Timeline,
    measure_baseline,
    prepare,
    routing_section,
    write_config,
    write_flag,
)
from specguard.report import weekly
from specguard.sim.flag_router import FlagRouter
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.slack_api import SlackApi, running
from specguard.sim.traffic import Traffic
from specguard.sources.targets import instance_label
from specguard.store.baseline import Baseline
from specguard.store.history import MINUTE


async def run_demo(
    directory: Path,
    out: TextIO,
    color: bool,
    timeline: Timeline | None = None,
    choice: Choice | None = None,
) -> int:
    """The demo, its router ``choice`` (default: nginx when it can run the router here)."""
    timeline = timeline or Timeline()
    began = time.time()  # the report covers the demo from the start of this minute
    prepare(directory)
    run = DemoRun(Terminal(out, color), directory, timeline)
    # The daemon's log, open until the report is written (matplotlib logs through it too).
    with (directory / "specguard.log").open("a", encoding="utf-8") as log_file:
        logs.setup("json", "info", stream=log_file)
        return await _run(run, began, choice or find_nginx())


def _host_port(url: str) -> str:
    return url.removeprefix("http://").rstrip("/")


async def _start_router(
    run: DemoRun, choice: Choice, spec: Simulator, standard: Simulator
) -> NginxRouter | None:
    """nginx running the router of the demo's ``routing:`` section (kept in ``run.routing``), or None
    for the demo's own router; ``run.router_said`` says which, and why."""
    run.pool_names = {spec.url: "speculative", standard.url: "standard"}
    if not choice.nginx:
        write_flag(run.directory, nginx=False)
        run.router_said = f"{choice.why}: the demo's own router"
        return None
    listen, admin = free_ports(2)
    routing = routing_section(run.directory, _host_port(spec.url), _host_port(standard.url), listen, admin)
    write_flag(run.directory, nginx=True)
    nginx = NginxRouter(choice, run.directory / NGINX_DIR, RoutingConfig.model_validate(routing))
    try:
        await nginx.start()
    except RuntimeError as exc:
        if choice.forced:
            raise
        write_flag(run.directory, nginx=False)
        run.router_said = f"{exc}: the demo's own router"
        return None
    run.routing, run.pool_names = routing, {}
    run.router_said = f"routing through nginx {choice.version} on {routing['listen']}"
    return nginx


async def _run(run: DemoRun, began: float, choice: Choice) -> int:
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
    nginx: NginxRouter | None = None
    try:
        try:
            nginx = await _start_router(run, choice, spec, standard)
        except RuntimeError as exc:  # --router nginx, and it did not start
            t.line(f"--router nginx: {exc}", "red")
            return 1
        async with running() as slack:
            slack.listeners.append(run.on_slack)
            config_path = write_config(
                directory, spec.url, slack, timeline.quiet_period, baseline=False, routing=run.routing
            )
            loaded = load(config_path)
            if not loaded.ok:  # the demo writes these files itself: this is a bug, say so plainly
                for problem in loaded.errors:
                    t.line(f"demo config problem: {problem}", "red")
                return 1
            daemon = Daemon(loaded, config_path, reports=weekly)
            daemon.on_event.append(run.on_event)
            daemon.dispatcher.on_run.append(run.on_run)
            streams: dict[str, Any] = {"concurrency": 4, "max_tokens": 64, "temperature": HEALTHY_TEMPERATURE}
            if nginx is not None:  # where nginx sends traffic, from the pool each answer names
                traffic = Traffic(
                    nginx.url, MODEL, on_answer=PoolWatch("speculative", run.on_pool), **streams
                )
            else:
                router = FlagRouter(directory / FLAG_FILE, spec.url, standard.url, run.on_route)
                traffic = Traffic(spec.url, MODEL, route=router, **streams)
            try:
                await daemon.start(handle_signals=False)
                print_banner(t, spec, standard, daemon, slack, directory, run.routing, choice.version)
                t.line(run.router_said)
                await traffic.start()
                t.line(
                    f"traffic: 4 concurrent streams at temperature {HEALTHY_TEMPERATURE:g}, through the router"
                )
                tasks.append(asyncio.create_task(pulse(run, daemon, traffic)))
                interrupted, closed = await _script(run, daemon, traffic, config_path, spec, slack)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await traffic.stop()
                if nginx is not None:
                    run.routed = await nginx.requests_by_pool()
                summary = daemon.rule_rows()
                baseline = daemon.loaded.baseline  # the measured one, after the reload
                await daemon.shutdown()
            thread = [dict(m) for m in slack.posted()]
    finally:
        if nginx is not None:
            await nginx.stop()
        await spec.stop()
        await standard.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    print_summary(t, run, summary, traffic, thread, interrupted, closed)
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
    value = await measure_baseline(daemon, run.directory, window, sim.options.draft_cost)
    if value is None:
        t.line("baseline: no latency data yet; latency_regression will report an error", "red")
        return
    write_config(run.directory, sim.url, slack, run.timeline.quiet_period, baseline=True, routing=run.routing)
    reloaded = await daemon.reload()
    t.line(
        f"baseline measured: e2e p95 {value:.2f}s -> baseline.json; config reloaded ({'ok' if reloaded else 'failed'})"
    )
    t.detail(f"latency_regression now fires above 1.2 x {value:.2f}s = {1.2 * value:.2f}s", "dim")
    t.detail(
        f"speculation_unprofitable now knows the draft's cost per step: c = {sim.options.draft_cost:g}", "dim"
    )


def main(state_dir: Path | None, color: bool | None, router: str = "auto") -> int:
    choice = choose(router)
    if isinstance(choice, str):
        print(f"specguard demo: {choice}", file=sys.stderr)
        return 2
    directory = state_dir or Path(tempfile.mkdtemp(prefix="specguard-demo-"))
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return asyncio.run(run_demo(directory, sys.stdout, color, choice=choice))
