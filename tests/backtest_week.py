"""The report's synthetic week (``tests/week.py``) played live through a real daemon, for the
backtest: its scrape source, history, engine, dispatcher, fallback flag and store on a simulated
clock, one scrape and one evaluation round in the middle of every minute. What the daemon recorded
(history, firings, the flag's changes) is what a backtest of the same rules must reproduce; the
timeline's ground truth is kept to build the same week for Prometheus (``openmetrics``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from tests.week import DAY, MONDAY, Server, Timeline, server_a, server_b

CONFIG = """
state_dir: {state}
interval: 60s
sources:
  scrape:
    targets:
      - {{url: "http://127.0.0.1:9/a/metrics", name: "vllm-a:8000"}}
      - {{url: "http://127.0.0.1:9/b/metrics", name: "vllm-b:8000"}}
rules: [rules.yaml]
report: {{schedule: null}}
actions:
  fallback:
    type: feature_flag
    file: {{path: flag.json, engage: {{speculative: false}}, restore: {{speculative: true}}}}
    quiet_period: 10m
"""

# The report week's rules: the playbook's fallback trigger and KV pressure; and a collapse detector
# at the history's resolution (a minute's window).
RULES = """
rules:
  - name: acceptance_collapse
    signal: acceptance_rate
    window: 60s
    interval: 60s
    consecutive: 3
    condition: "< 0.4"
    no_data: keep
    severity: critical
    actions: [log, fallback]
  - name: kv_pressure
    signal: kv_cache_usage
    window: 60s
    interval: 60s
    condition: "> 0.95"
    for: 5m
    severity: warning
    actions: [log]
"""

DETECTOR = """
  - name: collapse_detector
    signal: token_acceptance
    interval: 60s
    detect:
      in_control: learn
      drop: [0.12, 0.3]
      false_alarm_every: 30d
      warmup: 1h
      min_trials: 100
    no_data: keep
    severity: critical
    actions: [log]
"""


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Played:
    directory: Path
    config: Path
    rules: Path
    store: Path
    start: float
    end: float
    servers: list[Server]
    flag: list[tuple[float, bool]] = field(default_factory=list)  # (when, speculative) as the file said


def play(
    directory: Path, rules: str = RULES, days: float = 7.0, start: float = MONDAY, state: Path | None = None
) -> Played:
    """The week (``days`` of it from ``start``) played live; every ``time.time()`` of the daemon reads
    the simulated clock meanwhile. ``state``: where the daemon keeps its database (default: in
    ``directory``; a memory file system spares the week's 10,080 rounds their synced commits)."""
    import asyncio

    state = state or directory / "state"
    config = directory / "specguard.yaml"
    config.write_text(CONFIG.format(state=state))
    (directory / "rules.yaml").write_text(rules)
    clock = Clock(start)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", clock)
        played = asyncio.run(_play(directory, config, clock, start, start + days * DAY))
    return played


async def _play(directory: Path, config: Path, clock: Clock, start: float, end: float) -> Played:
    loaded = load(config)
    assert loaded.ok, loaded.problems
    daemon = Daemon(loaded, config)
    await daemon.store.open()
    a = Server("vllm-a:8000", "model-a", 5, server_a)
    b = Server("vllm-b:8000", "model-b", 3, server_b)
    urls = {a.instance: "http://127.0.0.1:9/a/metrics", b.instance: "http://127.0.0.1:9/b/metrics"}
    timeline = Timeline([a, b])
    played = Played(
        directory, config, directory / "rules.yaml", loaded.config.store_file(), start, end, [a, b]
    )
    flag = directory / "flag.json"
    minute = start
    try:
        while minute < end:
            clock.now = minute + 30  # the scrape, and the round, in the middle of the minute
            for server in (a, b):
                timeline.advance(server, minute)
                daemon.source.ingest(urls[server.instance], timeline.exposition(server), clock.now)
            await daemon.jobs.record_history(daemon.source)
            await daemon.evaluate_round()
            await daemon.dispatcher.run()  # restores whose quiet period is over
            await daemon.dispatcher.settled()
            if flag.exists():
                speculative = json.loads(flag.read_text())["speculative"]
                if not played.flag or played.flag[-1][1] != speculative:
                    played.flag.append((clock.now, speculative))
            minute += 60
    finally:
        await daemon.dispatcher.stop()
        await daemon.store.close()
    return played


def openmetrics(servers: Sequence[Server], start: float, end: float) -> str:
    """The week as a Prometheus scraping every 15 s would hold it (OpenMetrics text for ``promtool
    tsdb create-blocks-from openmetrics``): the speculative counters, grown by each minute's traffic
    at the minute's live scrape (30 s in), and the KV-cache gauge, holding the minute's value all
    through the minute; labelled with ``instance`` and ``model_name`` as history keeps a server.

    The samples fall 5, 20, 35 and 50 s into each minute, never on a whole minute, so that the range
    ``[1m]`` of a query at a whole minute t holds exactly the four samples of the minute before t
    whether its start is closed (Prometheus 2) or open (Prometheus 3): ``avg_over_time`` of the gauge
    is that minute's value, and the counters grow over the range by exactly that minute's increase,
    as the minute of history the history source reads at t. A sample on the whole minute would sit
    in two ranges under Prometheus 2, and average the minute before into the gauge.

    ``rate()`` extrapolates that growth to the whole range (the first sample 5 s after its start, the
    last 10 s before its end, both within 1.1 times the interval of 15 s): by 60/45 for every series
    alike, and in the period's first minute, whose counters start at zero, only to the end, again
    alike. So ``increase()`` reads 4/3 of a minute's increase, while a ratio of two counters of one
    server (``acceptance_rate``) is the minute's ratio exactly.
    """
    families = {
        "vllm:spec_decode_num_accepted_tokens": "counter",
        "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_drafts": "counter",
        "vllm:kv_cache_usage_perc": "gauge",
    }
    counters = list(families)[:3]
    lines: dict[str, list[str]] = {name: [] for name in families}
    for server in servers:
        labels = f'engine="0",instance="{server.instance}",model_name="{server.model}"'
        accepted = tokens = drafts = 0.0
        for minute in server.truth:
            if not start <= minute.at < end:
                continue
            before = (accepted, tokens, drafts)
            accepted += minute.accepted
            tokens += minute.draft_tokens
            drafts += minute.drafts
            for offset in (5, 20, 35, 50):
                at = minute.at + offset
                values = (accepted, tokens, drafts) if offset >= 30 else before
                for name, value in zip(counters, values, strict=True):
                    lines[name].append(f"{name}_total{{{labels}}} {value!r} {at:.0f}")
                lines["vllm:kv_cache_usage_perc"].append(
                    f"vllm:kv_cache_usage_perc{{{labels}}} {minute.kv!r} {at:.0f}"
                )
    out = []
    for name, kind in families.items():
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines[name])
    out.append("# EOF")
    return "\n".join(out) + "\n"


def record_history(store: Path, servers: Sequence[Server], start: float, minutes: int, seed: int = 7) -> None:
    """``minutes`` of the servers' traffic from ``start`` written straight into the history of the
    store at ``store`` (scraped 30 s into each minute, as the daemon's history job records them),
    without a daemon: for tests of what reads history. Each server's ``truth`` keeps what it did."""
    import asyncio

    from specguard.store import history
    from specguard.store.database import opened
    from specguard.store.exposition import parse_exposition

    timeline = Timeline(list(servers), seed=seed)

    async def write() -> None:
        async with opened(store) as db:
            for i in range(minutes):
                minute = start + i * 60
                scrapes = []
                for server in servers:
                    timeline.advance(server, minute)
                    scrapes.append(
                        (server.instance, minute + 30, parse_exposition(timeline.exposition(server)))
                    )
                await db.call(lambda c, s=scrapes: history.record(c, s), synced=False)

    asyncio.run(write())
