"""The dispatcher: events -> action runs, through guards, recorded in the store.

Only ``firing`` and ``resolved`` events reach actions. A firing runs each of the rule's actions; a
resolution runs the actions that only tell (``log``, ``slack``) and *restores* the ones that change
the world (``feature_flag``), once the rule has stayed resolved for the action's quiet period.
Every decision not to run is recorded with its reason (the guards, ``daemon.dispatch.guards``).
Runs are written to the store as ``pending`` in the same transaction as the state change, then
carried out when due; a run interrupted by a crash is carried out after the restart (actions are
idempotent).

What each action holds in the world (a fallback engaged, vLLM's k) is shown on the daemon's
``/metrics``: read from the store when the dispatcher starts serving, again whenever an action's
memory changes (whoever changed it), and for every action when the actions are replaced (a reload).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from actions import Action, ActionContext
from actions.base import RunOutcome
from daemon.dispatch import guards
from daemon.dispatch.memory import StoreMemory
from daemon.engine import Event, State
from daemon.loading import LoadedRule
from daemon.selfmetrics import DaemonMetrics
from daemon.store import ActionRun, EventRecord, Guard, PlannedRun, Store
from rules.durations import format_duration
from rules.templates import render

log = logging.getLogger("specguard.dispatcher")

ACTIONABLE = (State.FIRING, State.RESOLVED)
TICK_RETRY = 30.0  # seconds before an action's own work that raised is tried again
# What specguard_action_runs_total counts runs under. Each action's are exported from 0: a counter
# that first appears at 1 is an increase Prometheus never sees (increase() over it reads 0).
RUN_STATUSES = ("ok", "failed", "skipped", "retry")


def describe(item: LoadedRule, event: Event) -> tuple[str, dict[str, str]]:
    """The event's summary and rendered annotations."""
    rule = item.rule
    fields = {
        "threshold": event.threshold,
        "rule": rule.name,
        "signal": rule.signal or ("alerts" if rule.alert_only else "expr"),
        "severity": rule.severity.value,
        "state": event.kind.value,
    }
    annotations = {}
    for key, template in rule.annotations.items():
        try:
            annotations[key] = render(template, labels=event.labels, value=event.value, **fields)
        except ValueError as exc:
            annotations[key] = template
            log.warning("rule %s: annotation %s: %s", rule.name, key, exc)
    summary = annotations.get("summary")
    if summary is None:
        where = ", ".join(f"{k}={v}" for k, v in sorted(event.labels.items())) or "all series"
        value = "no data" if event.value is None else f"{event.value:.4g}"
        if rule.alert is not None and rule.alert_only:
            matchers = ", ".join(str(m) for m in rule.alert.matchers)
            summary = f"{value} Alertmanager alert(s) {{{matchers}}} firing on {where}"
        elif rule.detect is not None:
            h = "?" if event.threshold is None else f"{event.threshold:.4g}"
            summary = f"{rule.detect.describe()}: G = {value} of h = {h} on {where}"
        else:
            summary = f"{rule.signal or 'expr'} = {value} ({rule.test}) on {where}"
    return summary, annotations


class Dispatcher:
    def __init__(self, store: Store, actions: Mapping[str, Action], dry_run: bool, metrics: DaemonMetrics):
        self.store = store
        self.metrics = metrics
        self._actions: dict[str, Action] = {}
        self._holdings_stale: set[str] = set()  # actions whose holding /metrics shows may be old
        self._holdings_due = asyncio.Event()
        self.actions = dict(actions)
        self.dry_run = dry_run
        # Called after each run with (run, status, detail): how an embedding program (the demo)
        # shows what was done.
        self.on_run: list[Callable[[ActionRun, str, str], None]] = []
        self._in_flight: set[int] = set()  # runs being carried out now
        self._due = asyncio.Event()  # set when runs were recorded: the waiting may change
        # Runs the guards held back, on the store's writer thread, to be logged and counted on
        # the event loop by the next run() (called once the events are stored).
        self._held: list[tuple[Event, PlannedRun]] = []
        self._next_tick: float | None = None  # when an action next has work of its own
        self._aside: set[asyncio.Task[None]] = set()  # long runs, carried out beside the rest
        self._ticking: set[str] = set()  # long-running actions whose tick is under way aside
        store.memory_listeners.append(self._memory_changed)

    @property
    def actions(self) -> dict[str, Action]:
        return self._actions

    @actions.setter
    def actions(self, actions: Mapping[str, Action]) -> None:
        # New instances (a reload): each may read its holding differently (another flag file),
        # and the gauges of an action no longer configured must go.
        self._holdings_stale.update(self._actions, actions)
        self._actions = dict(actions)
        self._holdings_due.set()
        for name in self._actions:
            for status in RUN_STATUSES:
                self.metrics.action_runs.labels(name, status)

    def _memory_changed(self, action: str) -> None:
        self._holdings_stale.add(action)
        self._holdings_due.set()

    async def show_holdings(self, names: Sequence[str] | None = None) -> None:
        """Show on /metrics what the actions ``names`` (default: all) hold now, from the store."""
        for name in list(self._actions) if names is None else names:
            action = self._actions.get(name)
            if action is None:
                self.metrics.show_holding(name, None)
                continue
            try:
                holding = await action.holding(StoreMemory(self.store, name))
            except Exception as exc:  # the last value stays; the next change reads it again
                log.warning("action %s: cannot read what it holds: %s: %s", name, type(exc).__name__, exc)
                continue
            self.metrics.show_holding(name, holding)

    async def _show_holdings_when_stale(self) -> None:
        # The first pass shows every action (the setter in __init__ marked them all): what a previous
        # process left in the store, a flag engaged before a restart included.
        while True:
            await self._holdings_due.wait()
            self._holdings_due.clear()
            stale, self._holdings_stale = self._holdings_stale, set()
            await self.show_holdings(sorted(stale))

    @property
    def guard(self) -> Guard:
        """The guards, for the store to apply in the transaction that records an event."""
        check = partial(guards.check, actions=self.actions)

        def guard(db: Any, event: Event, planned: PlannedRun) -> PlannedRun:
            decided = check(db, event, planned)
            if decided.status == "skipped":
                self._held.append((event, decided))  # list.append: one step under the GIL
            return decided

        return guard

    def _report_held(self) -> None:
        held, self._held = self._held, []
        for event, run in held:
            log.info("%s %s: not running %s (%s)", event.rule, event.kind.value, run.action, run.reason)
            self.metrics.action_runs.labels(run.action, "skipped").inc()

    def record(self, item: LoadedRule, event: Event) -> EventRecord:
        """Decide what to do about ``event`` (nothing runs yet; the guards have the last word
        when it is stored)."""
        summary, annotations = describe(item, event)
        runs: list[PlannedRun] = []
        if event.kind in ACTIONABLE:
            for name in item.rule.actions:
                action = self.actions.get(name)
                if (
                    event.kind is State.RESOLVED
                    and action is not None
                    and action.changes_world
                    and not action.restores
                ):
                    continue  # it undoes nothing when the rule resolves (a ladder steps up by hand)
                restore = event.kind is State.RESOLVED and action is not None and action.restores
                mode = "restore" if restore else "run"
                not_before = event.at + action.restore_delay if restore and action is not None else None
                if item.rule.shadow:
                    runs.append(
                        PlannedRun(name, "skipped", "shadow rule: evaluated and recorded, never acts", mode)
                    )
                elif self.dry_run:
                    runs.append(PlannedRun(name, "skipped", "dry run", mode))
                else:
                    runs.append(PlannedRun(name, "pending", "", mode, not_before))
        for run in runs:
            if run.status == "skipped":
                log.info(
                    "%s %s: not running %s (%s): %s", item.name, event.kind, run.action, run.reason, summary
                )
                self.metrics.action_runs.labels(run.action, run.status).inc()
        return EventRecord(
            event=event,
            severity=item.rule.severity.value,
            summary=summary,
            annotations=annotations,
            shadow=item.rule.shadow,
            dry_run=self.dry_run,
            runs=runs,
            trigger=event.trigger,
        )

    async def run(self, ids: Sequence[int] | None = None) -> None:
        """Carry out pending runs that are due (``ids``, or every unfinished one)."""
        self._report_held()
        for run in await self.store.runs_to_do(ids):
            if run.id in self._in_flight:
                continue  # carried out by another caller right now
            self._in_flight.add(run.id)
            action = self.actions.get(run.action)
            if action is not None and action.long_running:
                task = asyncio.get_running_loop().create_task(self._run_aside(run))
                self._aside.add(task)
                task.add_done_callback(self._aside.discard)
                continue
            try:
                await self._run_one(run)
            finally:
                self._in_flight.discard(run.id)
        self._due.set()  # restores may have been recorded, or put off: the waiting changes

    async def _run_aside(self, run: ActionRun) -> None:
        try:
            await self._run_one(run)
        finally:
            self._in_flight.discard(run.id)
            self._due.set()

    async def stop(self) -> None:
        """Cancel the long runs carried out aside: they stay 'running' in the store and are
        carried out again (the action resumes its journal) at the next start."""
        for task in list(self._aside):
            task.cancel()
        for task in list(self._aside):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def wake(self) -> None:
        """Look again now: an action was given work of its own (a report to post)."""
        self._due.set()

    async def tick(self) -> None:
        """Each action's own due work (a Slack outbox); notes when the next is due."""
        upcoming: list[float] = []
        for name, action in list(self.actions.items()):
            if action.long_running:  # its own work may take minutes (resuming a restart): aside
                if name not in self._ticking:
                    self._ticking.add(name)
                    task = asyncio.get_running_loop().create_task(self._tick_aside(name, action))
                    self._aside.add(task)
                    task.add_done_callback(self._aside.discard)
                continue
            try:
                async with asyncio.timeout(action.timeout):
                    due = await action.tick(StoreMemory(self.store, name))
            except Exception:  # one action's trouble must not stop the others, or the loop
                log.exception("action %s: its own work failed; tried again in %gs", name, TICK_RETRY)
                due = time.time() + TICK_RETRY
            if due is not None:
                upcoming.append(due)
        self._next_tick = min(upcoming, default=None)

    async def _tick_aside(self, name: str, action: Action) -> None:
        try:
            async with asyncio.timeout(action.timeout):
                await action.tick(StoreMemory(self.store, name))
        except Exception:
            log.exception("action %s: its own work failed", name)
        finally:
            self._ticking.discard(name)

    def _changed_world(self, name: str) -> bool:
        action = self.actions.get(name)
        return action is not None and action.changes_world

    async def _outcomes(self, event_id: int) -> list[RunOutcome]:
        """What the event's world-changing actions did so far (what a notice tells; a log line
        or another notice is not news)."""
        return [o for o in await self.store.event_outcomes(event_id) if self._changed_world(o.action)]

    async def _tell_observers(self, ended: RunOutcome) -> None:
        if not self._changed_world(ended.action):
            return
        for name, action in list(self.actions.items()):
            if not action.observes or name == ended.action:
                continue
            try:
                async with asyncio.timeout(action.timeout):
                    await action.observe(ended, StoreMemory(self.store, name))
            except Exception:
                log.exception("action %s could not take in how %s ended", name, ended.action)

    async def serve(self) -> None:
        """Carry out runs as they fall due (restores after their quiet period, restores tried
        again after a failed canary), and the actions' own work; until cancelled."""
        holdings = asyncio.get_running_loop().create_task(self._show_holdings_when_stale())
        try:
            await self._serve()
        finally:
            holdings.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holdings

    async def _serve(self) -> None:
        await self.tick()
        while True:
            self._due.clear()  # before reading: a run recorded meanwhile wakes the wait below
            due = await self.store.next_due()
            soonest = min((t for t in (due, self._next_tick) if t is not None), default=None)
            wait = None if soonest is None else max(0.0, soonest - time.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._due.wait()
            if due is not None and time.time() >= due:
                await self.run()
            # After a run (its notices to send) or at the time an action asked for.
            await self.tick()

    async def _run_one(self, run: ActionRun) -> None:
        if self.dry_run:
            # Written before the daemon was told to run dry (a restart with --dry-run): recorded,
            # never carried out.
            reason = "dry run: a run left from before, not carried out"
            await self.store.skip_run(run.id, reason)
            self.metrics.action_runs.labels(run.action, "skipped").inc()
            log.info("%s %s: not running %s (%s)", run.rule, run.kind, run.action, reason)
            return
        action = self.actions.get(run.action)
        if action is None:
            await self.store.finish_run(run.id, "failed", f"action {run.action!r} is no longer configured")
            self.metrics.action_runs.labels(run.action, "failed").inc()
            return
        ctx = ActionContext(
            rule=run.rule,
            event=run.kind,
            severity=run.severity,
            labels=run.labels,
            value=run.value,
            threshold=run.threshold,
            summary=run.summary,
            annotations=run.annotations,
            event_id=run.event_id,
            series=run.series,
            at=run.at,
            since=run.since,
            memory=StoreMemory(self.store, run.action),
            outcomes=tuple(await self._outcomes(run.event_id)) if action.observes else (),
        )
        await self.store.start_run(run.id)
        retry_after: float | None = None
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that arrives as the action finishes, and a stop would then hang.
            async with asyncio.timeout(action.timeout):
                outcome = await (action.restore(ctx) if run.mode == "restore" else action.run(ctx))
            status, detail = ("ok" if outcome.ok else "failed"), outcome.detail
            retry_after = None if outcome.ok else outcome.retry_after
        except TimeoutError:
            status, detail = "failed", f"timed out after {action.timeout:g}s"
        except Exception as exc:  # an action's bug must not stop the daemon
            log.exception("action %s failed for %s", run.action, run.rule)
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
        what = "restore" if run.mode == "restore" else run.kind
        if retry_after is not None:
            # Not done yet (a canary saw acceptance still low): the run waits, and is tried again.
            await self.store.retry_run(run.id, detail, time.time() + retry_after)
            self.metrics.action_runs.labels(run.action, "retry").inc()
            log.warning(
                "action %s for %s %s: not yet, again in %s: %s",
                run.action,
                run.rule,
                what,
                format_duration(round(retry_after)),
                detail,
            )
            self._due.set()
            for observer in self.on_run:
                observer(run, "retry", detail)
            return
        await self.store.finish_run(run.id, status, detail)
        self.metrics.action_runs.labels(run.action, status).inc()
        ended = RunOutcome(run.rule, run.series, run.kind, run.action, run.mode, status, detail, time.time())
        await self._tell_observers(ended)
        for observer in self.on_run:
            observer(run, status, detail)
        if status != "ok":
            log.warning("action %s for %s %s failed: %s", run.action, run.rule, what, detail)
        else:
            log.info("action %s for %s %s: %s", run.action, run.rule, what, detail)
