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


def play(directory: Path, rules: str = RULES, days: float = 7.0, start: float = MONDAY) -> Played:
    """The week (``days`` of it from ``start``) played live; every ``time.time()`` of the daemon reads
    the simulated clock meanwhile."""
    import asyncio

    state = directory / "state"
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
    played = Played(directory, config, directory / "rules.yaml", loaded.config.store_file(), start, end, [a, b])
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
    tsdb create-blocks-from openmetrics``): the speculative counters (grown by each minute's traffic
    at the minute's live scrape, 30 s in) and the KV-cache gauge (the minute's value from just after
    the minute starts). A range of whole minutes then holds the same increases and samples as the
    minutes of history."""
    families = {
        "vllm:spec_decode_num_accepted_tokens": "counter",
        "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_drafts": "counter",
        "vllm:kv_cache_usage_perc": "gauge",
    }
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
            for offset in (15, 30, 45, 60):
                at = minute.at + offset
                grown = offset >= 30
                values = (accepted, tokens, drafts) if grown else before
                for name, value in zip(list(families)[:3], values, strict=True):
                    lines[name].append(f"{name}_total{{{labels}}} {value!r} {at:.0f}")
                lines["vllm:kv_cache_usage_perc"].append(f"vllm:kv_cache_usage_perc{{{labels}}} {minute.kv!r} {at:.0f}")
    out = []
    for name, kind in families.items():
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines[name])
    out.append("# EOF")
    return "\n".join(out) + "\n"
