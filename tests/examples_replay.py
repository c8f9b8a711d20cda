"""Replays an example of ``tests/examples/`` through the daemon itself, on a fake clock.

An example is a folder: ``rules.yaml`` (and ``config.yaml`` when it needs one; without it the
config is ``rules: [rules.yaml]``), ``timeline.yaml`` (what happens, and when) and
``expected.yaml`` (what the daemon must have recorded). The folder is copied to a scratch
directory, loaded as ``specguard run`` loads a config, and played by a real ``Daemon``: its own
evaluation rounds (``Daemon.evaluate_round``, per interval, on the daemon's schedule from 0s), its
webhook intake (``Daemon.deliver``, then the step its alert queue runs), the silences' own store
functions, and its dispatcher stepped after each of them as its serve loop steps it
(``Dispatcher.step``), with the real guards, actions and SQLite store. Only the source is a
stand-in: it answers each signal with the latest readings the timeline gave, selected by the
rule's ``match`` and grouped by its ``group_by`` as the real sources do. Every ``time.time()`` of
the daemon reads the fake clock.

``timeline.yaml``::

    start: 2026-12-03T10:00:00Z      # the clock's 0s (optional; this is the default)
    until: 20m                       # the last moment played
    series:                          # names for label sets, used by the readings
      a: {instance: vllm-a:8000, model_name: llama-8b}
    steps:
      - at: 0s
        read: {acceptance_rate: {a: 0.62}}         # the source answers this from now on
      - at: 2m
        read: {acceptance_rate: {a: 0.45}, kv_cache_usage: {}}   # {}: no series (no data)
      - at: 3m
        read: {token_acceptance: {a: {value: 0.74, trials: 400}}}  # a detector's window
      - at: 4m
        read: {acceptance_rate: "connection refused"}   # the query fails
      - at: 5m
        silence: {rule: "acceptance_*", match: {instance: vllm-a:8000}, for: 10m,
                  reason: rolling out draft v2, author: alice}
      - at: 6m
        expire_silence: 1
      - at: 7m
        webhook:                                    # one Alertmanager delivery (version 4)
          - {labels: {alertname: AcceptanceLow, instance: a}, status: firing, starts: 6m}
      - at: 8m
        look: true                                  # expected.yaml says where things stand now

Steps at one moment come first, then the rounds due then, then a step of the dispatcher, then a
look. The readings are what the source would answer for the rule's window: the stand-in does not
compute windows (a detector's reading is one window's acceptance and trials).

``expected.yaml`` lists every event in order with its message and what its actions did, each
delivery's answer, what each look saw, and where the series stand at the end (``outcome``).
``SPECGUARD_REGOLD=1`` rewrites it from what the replay recorded: read the diff before committing.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from specguard.config import loading
from specguard.daemon import runtime
from specguard.daemon.alertmanager import payload
from specguard.dispatch import silences
from specguard.engine import detection
from specguard.rules import durations, matchers, signals
from specguard.sources import base as sources
from specguard.store import records
from tests import am_payloads

EXAMPLES = Path(__file__).parent / "examples"
START = "2026-12-03T10:00:00Z"
HEADER = (
    "# What replaying timeline.yaml must record (tests/unit/rules/test_golden_examples.py).\n"
    "# SPECGUARD_REGOLD=1 rewrites this file from the replay: check every change by hand.\n"
)


class Clock:
    """The fake clock: every ``time.time()`` of the daemon's code reads ``now``."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TimelineSource:
    """The source: each signal answers the latest readings the timeline gave for it."""

    kind = "scrape"

    def __init__(self, series: Mapping[str, Mapping[str, str]]) -> None:
        self.series = {name: {k: str(v) for k, v in labels.items()} for name, labels in series.items()}
        self.readings: dict[str, Any] = {}  # signal -> {series name: value | {value, trials}} | error

    def read(self, readings: Mapping[str, Any]) -> None:
        self.readings.update(readings)

    async def refresh(self) -> None:
        return None

    async def query_signal(
        self,
        signal: signals.Signal,
        window: float,
        group_by: Sequence[str],
        match: Sequence[matchers.Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> sources.SourceResult:
        given = self.readings.get(signal.name, {})
        if isinstance(given, str):
            return sources.SourceResult.failed(given)
        groups = signal.groups(group_by, keep_intrinsic)
        picked: dict[str, tuple[dict[str, str], Any]] = {}
        for name, reading in given.items():
            labels = self.series[name]
            if not matchers.all_match(tuple(match), labels):
                continue
            grouped = {g: labels[g] for g in groups if labels.get(g, "") != ""}
            key = json.dumps(grouped, sort_keys=True)
            if key in picked:
                raise ValueError(f"{signal.name}: two series read as {key} under group_by {list(groups)}")
            picked[key] = (grouped, reading)
        if signal.kind is signals.Kind.CHAIN:  # a value and the trials behind it
            counts = [
                sources.ChainCounts(labels, r["value"] * r["trials"], r["trials"], r["trials"], r["trials"])
                for labels, r in picked.values()
            ]
            return sources.chain_result(signal, counts, scale=1.0)
        return sources.SourceResult.checked(signal, [(labels, float(r)) for labels, r in picked.values()])

    async def query_expr(self, expr: str) -> sources.SourceResult:
        return sources.SourceResult.failed("the timeline answers the catalog's signals only")

    async def close(self) -> None:
        return None


def seconds(value: Any) -> float:
    return durations.parse_duration(value)


def shown(at: float | None, start: float) -> str | None:
    """A moment as the example writes it: ``12m15s`` after the clock's 0s."""
    return None if at is None else durations.format_duration(at - start)


def number(value: float | None) -> float | None:
    """Six significant digits: what a message or a threshold shows, not a float's last bits."""
    return None if value is None else float(f"{value:.6g}")


def unix(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


async def replay(example: Path, workdir: Path) -> dict[str, Any]:
    """What the daemon recorded while playing ``example``'s timeline (see the module's doc)."""
    here = workdir / example.name
    shutil.copytree(example, here)
    config = here / "config.yaml"
    if not config.exists():
        config.write_text("rules: [rules.yaml]\n")
    loaded = loading.load(config, overrides={"state_dir": str(workdir / "state")})
    assert loaded.ok, "\n".join(str(p) for p in loaded.errors).replace(str(here), str(example))
    timeline = yaml.safe_load((here / "timeline.yaml").read_text())
    unknown = set(timeline) - {"start", "series", "steps", "until"}
    assert not unknown, f"{example.name}/timeline.yaml: unknown keys {sorted(unknown)}"
    start = unix(str(timeline.get("start", START)))
    clock = Clock(start)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", clock)
        daemon = runtime.Daemon(loaded, config)
        await daemon.source.close()
        daemon.source = source = TimelineSource(timeline.get("series", {}))
        await daemon.store.open()
        try:
            seen = await play(daemon, source, timeline, clock, start)
            found = await outcome(daemon, start, seen)
        finally:
            await daemon.dispatcher.stop()
            await daemon.store.close()
    as_named: dict[str, Any] = json.loads(json.dumps(found).replace(f"{here}/", ""))
    return as_named  # file paths (a flag file's) as the example names them


async def play(
    daemon: runtime.Daemon, source: TimelineSource, timeline: Mapping[str, Any], clock: Clock, start: float
) -> dict[str, list[Any]]:
    """Every moment something is due, in order: the timeline's steps, the rounds of each rule
    interval (from 0s, as the daemon schedules them), and the runs the dispatcher waits for.
    Returns each delivery's answer and what each ``look`` saw."""
    steps = sorted(timeline.get("steps", []), key=lambda step: seconds(step["at"]))
    until = seconds(timeline["until"])
    config = daemon.loaded.config
    intervals = sorted({item.rule.interval or config.interval for item in daemon.loaded.enabled_rules()})
    seen: dict[str, list[Any]] = {"deliveries": [], "looks": []}
    recorded: list[object] = []
    daemon.on_event.append(lambda item, record: recorded.append(record))
    flags = any(action.reconciled for action in daemon.dispatcher.actions.values())
    t = 0.0
    while t <= until:
        clock.now = start + t
        now = [s for s in steps if math.isclose(seconds(s["at"]), t)]
        before = len(recorded)
        for step in now:
            await take(daemon, source, step, clock.now, start, seen["deliveries"])
        for every in intervals:
            if math.isclose(t / every, round(t / every), abs_tol=1e-9):
                await daemon.evaluate_round(every)
        # The daemon's dispatcher steps after every round. A step with nothing recorded, nothing
        # waiting and no flag to keep in line does nothing: left out, it costs nothing (an hour of
        # a quiet detector would cost 720).
        if now or len(recorded) > before or daemon.dispatcher.waiting or flags:
            await daemon.dispatcher.step()
        if any(step.get("look") for step in now):
            seen["looks"].append({"at": shown(clock.now, start), **await standing(daemon, start)})
        due = await daemon.store.next_due() if daemon.dispatcher.waiting else None
        later = [seconds(s["at"]) for s in steps if seconds(s["at"]) > t + 1e-9]
        later += [(math.floor(t / every + 1e-9) + 1) * every for every in intervals]
        later += [due - start] if due is not None and due > clock.now else []
        t = min(later)
    return seen


STEP_KEYS = {"at", "read", "silence", "expire_silence", "webhook", "look"}


async def take(
    daemon: runtime.Daemon,
    source: TimelineSource,
    step: Mapping[str, Any],
    now: float,
    start: float,
    deliveries: list[dict[str, Any]],
) -> None:
    """One step of the timeline, at ``now``. A key or a signal the replay does not know is an
    error: a typo must not pass as a step that did nothing."""
    unknown = set(step) - STEP_KEYS
    assert not unknown, f"timeline step at {step.get('at')}: unknown keys {sorted(unknown)}"
    if "read" in step:
        unknown = {name for name in step["read"] if name not in signals.CATALOG}
        assert not unknown, f"timeline step at {step['at']}: no signal named {sorted(unknown)}"
        source.read(step["read"])
    if "silence" in step:
        s = step["silence"]
        add = partial(
            silences.add, rule=s["rule"], match=s.get("match", {}), starts=now, ends=now + seconds(s["for"]),
            reason=s["reason"], author=s.get("author", "operator"), now=now,
        )  # fmt: skip
        await daemon.store.call(add)
    if "expire_silence" in step:
        await daemon.store.call(partial(silences.end, silence_id=step["expire_silence"], now=now))
    if "webhook" in step:
        alerts = [
            am_payloads.alert(
                {k: str(v) for k, v in a["labels"].items()},
                a["status"],
                starts_at=iso(start + seconds(a["starts"])),
                ends_at=iso(now) if a["status"] == "resolved" else None,
            )
            for a in step["webhook"]
        ]
        message = payload.parse(json.dumps(am_payloads.message(*alerts)).encode())
        stored = await daemon.deliver(message, now)
        # What the daemon's alert loop does with what a delivery queued: the book learns the
        # alerts, and every rule they concern is evaluated at once.
        while not daemon.intake.queue.empty():
            await daemon.intake._act_on_alerts(daemon.intake.queue.get_nowait())
        deliveries.append({"at": shown(now, start), "new": len(stored.new), "duplicates": stored.duplicates})


async def outcome(daemon: runtime.Daemon, start: float, seen: Mapping[str, list[Any]]) -> dict[str, Any]:
    """What the store holds: every event with its message and its actions' runs; each delivery's
    answer and what each look saw; where every series stands at the end."""
    events = []
    for e in reversed(await daemon.store.history(limit=100_000)):
        event: dict[str, Any] = {
            "at": shown(e["at"], start),
            "rule": e["rule"],
            "series": e["labels"],
            "change": f"{e['previous']} -> {e['kind']}",
            "value": number(e["value"]),
            "threshold": number(e["threshold"]),
            "severity": e["severity"],
            "message": e["summary"],
        }
        if e["trigger"] != records.SCHEDULE:
            event["trigger"] = e["trigger"]
        if e["annotations"]:
            event["annotations"] = e["annotations"]
        if e["shadow"]:
            event["shadow"] = True
        if e["dry_run"]:
            event["dry_run"] = True
        if e["runs"]:
            event["actions"] = [run_of(run, start) for run in e["runs"]]
        events.append(event)
    return {"events": events, **{k: v for k, v in seen.items() if v}, "final": await standing(daemon, start)}


async def standing(daemon: runtime.Daemon, start: float) -> dict[str, Any]:
    """Where each rule's series stand (a detector's statistic too), the runs that wait, and the
    rules without series that are in error or warming up."""
    out: dict[str, Any] = {}
    rules = {item.name: item for item in daemon.loaded.rules}
    for rule, states in sorted((await daemon.store.load_states()).items()):
        out[rule] = [
            series_of(s, rules[rule], daemon.loaded.config.interval) for _, s in sorted(states.items())
        ]
    for rule, (verdict, why) in sorted(daemon.rule_verdicts.items()):
        if rule not in out and (verdict, why) != ("no_data", "no data"):
            out[rule] = {"verdict": verdict, "why": why}
    waiting = [
        {"rule": w["rule"], "series": w["labels"], "action": w["action"], "status": w["status"],
         "why": w["why"], "until": shown(w["until"], start)}
        for w in daemon.dispatcher.waiting
    ]  # fmt: skip
    return {"states": out, **({"waiting": waiting} if waiting else {})}


def series_of(s: records.SeriesState, item: loading.LoadedRule, interval: float) -> dict[str, Any]:
    out: dict[str, Any] = {"series": dict(s.labels), "state": s.state.value}
    out["verdict"] = s.verdict.value if s.verdict else None
    if s.error:
        out["error"] = s.error
    detect = item.rule.detect
    if detect is not None:  # what /api/status shows of a detector, in short
        d = detection.shown(s, detect, item.rule.interval or interval) or {}
        out["detector"] = {
            "warmup": d.get("warmup"),
            "g": number(d.get("g")),
            "h": number(d.get("h")),
            "in_control": number(d.get("in_control")),
            "phi": number(d.get("phi")),
        }
    return out


def run_of(run: Mapping[str, Any], start: float) -> dict[str, Any]:
    out: dict[str, Any] = {"action": run["action"]}
    if run["mode"] != "run":
        out["mode"] = run["mode"]
    out["status"] = run["status"]
    for key in ("reason", "detail"):
        if run[key]:
            out[key] = run[key]
    if run["status"] in ("deferred", "pending") and run["not_before"] is not None:
        out["until"] = shown(run["not_before"], start)
    if run["finished"] is not None:
        out["done"] = shown(run["finished"], start)
    return out


def compare(expected: Any, actual: Any) -> str | None:
    """None when they agree; else a unified diff of the two, as YAML, expected first."""
    if expected == actual:
        return None
    want, got = (dump(x).splitlines(keepends=True) for x in (expected, actual))
    return "".join(difflib.unified_diff(want, got, "expected.yaml", "replayed", n=4))


class _Dumper(yaml.SafeDumper):
    """Short mappings of plain values (a series' labels, an action's run) on one line."""


def _mapping(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.MappingNode:
    plain = all(not isinstance(v, dict | list) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=plain and len(str(data)) < 100)


_Dumper.add_representer(dict, _mapping)


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def check(example: Path, actual: Mapping[str, Any]) -> None:
    """Fail with a diff when ``actual`` is not what ``expected.yaml`` says; with
    ``SPECGUARD_REGOLD=1``, rewrite ``expected.yaml`` instead."""
    path = example / "expected.yaml"
    if os.environ.get("SPECGUARD_REGOLD") == "1":
        path.write_text(HEADER + dump(actual))
        return
    expected = yaml.safe_load(path.read_text()) if path.exists() else None
    diff = compare(expected, actual)
    if diff is not None:
        pytest.fail(f"{example.name}: the replay disagrees with expected.yaml\n{diff}", pytrace=False)


def examples() -> list[Path]:
    """Every folder of the corpus (the completeness test checks that each has its files)."""
    return sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
