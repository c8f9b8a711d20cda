"""Dispatcher and store together: what runs, what is skipped and why, and what survives a crash."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

from specguard.actions.base import Action, ActionContext, ActionParams, Outcome
from specguard.config.loading import LoadedRule
from specguard.dispatch import Dispatcher
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.schema import Rule
from specguard.store.database import Store
from specguard.store.records import Event, SeriesState, State
from specguard.store.schema import SCHEMA_VERSION


class Recording(Action):
    type = "recording"
    calls: ClassVar[list[ActionContext]] = []
    behaviour: ClassVar[str] = "ok"

    async def run(self, ctx: ActionContext) -> Outcome:
        if self.behaviour == "slow":
            await asyncio.sleep(5)
        if self.behaviour == "raise":
            raise RuntimeError("boom")
        Recording.calls.append(ctx)
        return Outcome(True, "recorded")


@pytest.fixture(autouse=True)
def _reset() -> None:
    Recording.calls = []
    Recording.behaviour = "ok"


def rule(**extra: Any) -> LoadedRule:
    raw = {
        "name": "low",
        "signal": "acceptance_rate",
        "condition": "< 0.5",
        "actions": ["rec"],
        "annotations": {"summary": "acceptance {value:.2f} under {threshold} on {labels[instance]}"},
        **extra,
    }
    return LoadedRule(Rule.model_validate(raw), "rules.yaml", 2)


def firing(at: float = 100.0) -> Event:
    labels = {"instance": "h:8000"}
    return Event("low", '{"instance":"h:8000"}', labels, State.FIRING, State.PENDING, at, 0.31, 0.5)


def dispatcher(store: Store, dry_run: bool = False, timeout: float = 30.0) -> Dispatcher:
    action = Recording("rec", ActionParams(type="recording", timeout=timeout))
    return Dispatcher(store, {"rec": action}, dry_run, DaemonMetrics())


async def commit(store: Store, d: Dispatcher, item: LoadedRule, event: Event) -> list[int]:
    state = SeriesState(labels=event.labels, state=event.kind, since=event.at)
    return await store.commit_evaluation(item.name, {event.series: state}, [d.record(item, event)])


async def test_a_firing_event_runs_the_rules_action_once_with_the_rendered_summary(store: Store) -> None:
    d = dispatcher(store)
    pending = await commit(store, d, rule(), firing())
    await d.run(pending)
    assert len(Recording.calls) == 1
    ctx = Recording.calls[0]
    assert (ctx.rule, ctx.event, ctx.value, ctx.threshold) == ("low", "firing", 0.31, 0.5)
    assert ctx.summary == "acceptance 0.31 under 0.5 on h:8000"
    runs = await store.action_runs()
    assert [(r["action"], r["status"], r["detail"], r["attempts"]) for r in runs] == [
        ("rec", "ok", "recorded", 1)
    ]
    await d.run()  # nothing left to do
    assert len(Recording.calls) == 1


async def test_a_shadow_rule_records_the_run_as_skipped_and_never_acts(store: Store) -> None:
    d = dispatcher(store)
    pending = await commit(store, d, rule(shadow=True), firing())
    assert pending == []
    await d.run()
    assert Recording.calls == []
    runs = await store.action_runs()
    assert [(r["status"], r["reason"]) for r in runs] == [
        ("skipped", "shadow rule: evaluated and recorded, never acts")
    ]
    events = await store.events()
    assert events[0]["shadow"] == 1 and events[0]["kind"] == "firing"


async def test_dry_run_records_what_would_have_run(store: Store) -> None:
    d = dispatcher(store, dry_run=True)
    await commit(store, d, rule(), firing())
    await d.run()
    assert Recording.calls == []
    runs = await store.action_runs()
    assert [(r["action"], r["status"], r["reason"]) for r in runs] == [("rec", "skipped", "dry run")]


async def test_pending_events_are_recorded_but_run_no_action(store: Store) -> None:
    d = dispatcher(store)
    event = Event("low", "{}", {}, State.PENDING, State.INACTIVE, 1.0, 0.3, 0.5)
    assert await commit(store, d, rule(), event) == []
    assert await store.action_runs() == []
    assert [e["kind"] for e in await store.events()] == ["pending"]


async def test_a_run_left_pending_by_a_crash_is_carried_out_after_the_restart(tmp_path: Path) -> None:
    path = tmp_path / "specguard.db"
    first = Store(path)
    await first.open()
    await commit(first, dispatcher(first), rule(), firing())  # the process dies before running it
    await first.close()

    second = Store(path)
    await second.open()
    try:
        d = dispatcher(second)
        await d.run()
        await d.run()
        assert len(Recording.calls) == 1
        assert [r["status"] for r in await second.action_runs()] == ["ok"]
        states = await second.load_states()
        assert states["low"]['{"instance":"h:8000"}'].state is State.FIRING
    finally:
        await second.close()


async def test_an_action_that_overruns_its_timeout_fails_with_the_reason(store: Store) -> None:
    Recording.behaviour = "slow"
    d = dispatcher(store, timeout=0.05)
    await d.run(await commit(store, d, rule(), firing()))
    runs = await store.action_runs()
    assert [(r["status"], r["detail"]) for r in runs] == [("failed", "timed out after 0.05s")]


async def test_an_action_that_raises_fails_and_the_next_run_still_happens(store: Store) -> None:
    d = dispatcher(store)
    Recording.behaviour = "raise"
    await d.run(await commit(store, d, rule(), firing(100)))
    Recording.behaviour = "ok"
    await d.run(await commit(store, d, rule(), firing(200)))
    runs = sorted(await store.action_runs(), key=lambda r: r["id"])
    assert [(r["status"], r["detail"]) for r in runs] == [
        ("failed", "RuntimeError: boom"),
        ("ok", "recorded"),
    ]


async def test_a_run_for_an_action_no_longer_configured_fails_instead_of_vanishing(store: Store) -> None:
    d = dispatcher(store)
    pending = await commit(store, d, rule(), firing())
    d.actions = {}
    await d.run(pending)
    runs = await store.action_runs()
    assert [(r["status"], r["detail"]) for r in runs] == [("failed", "action 'rec' is no longer configured")]


async def test_a_database_from_a_newer_specguard_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "specguard.db"
    s = Store(path)
    await s.open()
    await s.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    newer = Store(path)
    with pytest.raises(RuntimeError, match="newer specguard"):
        await newer.open()
    await newer.close()


V1_SERIES_STATE = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
CREATE TABLE series_state (
    rule TEXT NOT NULL, series TEXT NOT NULL, labels TEXT NOT NULL, state TEXT NOT NULL,
    since REAL, breach_since REAL, last_breach REAL, consecutive INTEGER NOT NULL,
    verdict TEXT, value REAL, threshold REAL, error TEXT, last_eval REAL,
    PRIMARY KEY (rule, series)
);
INSERT INTO series_state VALUES
    ('low', '{"instance":"a"}', '{"instance": "a"}', 'firing', 10, 5, 10, 3, 'breach', 0.2, 0.5, NULL, 10);
"""


async def test_a_database_from_the_previous_version_is_upgraded_and_keeps_its_states(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "specguard.db"
    with sqlite3.connect(path) as db:
        db.executescript(V1_SERIES_STATE)
    store = Store(path)
    await store.open()
    try:
        states = await store.load_states()
        (series,) = states["low"].values()
        assert (series.state, series.since, series.ok_since, series.last_seen) == (
            State.FIRING,
            10,
            None,
            None,
        )
        await store.commit_evaluation("low", {"k": SeriesState(labels={}, last_seen=12.0)}, [])
        assert (await store.load_states())["low"]["k"].last_seen == 12.0
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )


V2_EVENTS = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '2');
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, rule TEXT NOT NULL,
    series TEXT NOT NULL, labels TEXT NOT NULL, kind TEXT NOT NULL, previous TEXT NOT NULL,
    value REAL, threshold REAL, severity TEXT NOT NULL, summary TEXT NOT NULL,
    annotations TEXT NOT NULL, shadow INTEGER NOT NULL, dry_run INTEGER NOT NULL
);
INSERT INTO events VALUES (1, 10, 'low', '{}', '{}', 'firing', 'pending', 0.2, 0.5, 'warning', 's', '{}', 0, 0);
"""


async def test_events_from_version_2_are_kept_and_read_as_moved_by_the_schedule(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "specguard.db"
    with sqlite3.connect(path) as db:
        db.executescript(V2_EVENTS)
    store = Store(path)
    await store.open()
    try:
        (old,) = await store.events()
        assert (old["rule"], old["kind"], old["trigger"]) == ("low", "firing", "schedule")
    finally:
        await store.close()


V3_RUNS = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '3');
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, rule TEXT NOT NULL,
    series TEXT NOT NULL, labels TEXT NOT NULL, kind TEXT NOT NULL, previous TEXT NOT NULL,
    value REAL, threshold REAL, severity TEXT NOT NULL, summary TEXT NOT NULL,
    annotations TEXT NOT NULL, shadow INTEGER NOT NULL, dry_run INTEGER NOT NULL,
    trigger TEXT NOT NULL DEFAULT 'schedule'
);
INSERT INTO events VALUES (1, 10, 'low', '{}', '{}', 'firing', 'pending', 0.2, 0.5, 'warning', 's', '{}', 0, 0,
    'schedule');
CREATE TABLE action_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT NULL REFERENCES events (id),
    action TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '', created REAL NOT NULL, started REAL, finished REAL,
    attempts INTEGER NOT NULL DEFAULT 0
);
INSERT INTO action_runs (event_id, action, status, created) VALUES (1, 'rec', 'pending', 10);
"""


async def test_a_run_left_pending_by_version_3_is_carried_out_after_the_upgrade(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "specguard.db"
    with sqlite3.connect(path) as db:
        db.executescript(V3_RUNS)
    store = Store(path)
    await store.open()
    try:
        (run,) = await store.runs_to_do()
        assert (run.action, run.mode, run.status) == ("rec", "run", "pending")
        await dispatcher(store).run()
        assert [(ctx.rule, ctx.since) for ctx in Recording.calls] == [("low", None)]  # no breach start then
        assert await store.runs_to_do() == []
    finally:
        await store.close()
