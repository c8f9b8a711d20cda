"""The dispatcher: events -> action runs, through guards, recorded in the store.

Only ``firing`` and ``resolved`` events reach actions. A firing runs each of the rule's actions; a
resolution runs the actions that only tell (``log``, ``slack``) and *restores* the ones that change
the world and undo on their own (a ladder with ``step_up_after``), once the rule has stayed
resolved that long. Every decision not to run now is recorded with its reason (the guards,
``dispatch.guards``): skipped for good, or deferred until a silence, a cooldown or the
budget lets it go, looked at again on every tick. Runs are written to the store as ``pending``
(or ``deferred``) in the same transaction as the state change, then carried out when due, beside
the round that recorded them (in order, one run of an action at a time); a run interrupted by a
crash is carried out after the restart (actions are idempotent).

A feature flag is not run per event: its controller (``dispatch.controller``) derives what
it should be from the rules' states on every tick and makes it so, recording its runs itself.

Each action's own work (``tick``: an outbox) is carried out beside the rest (``dispatch.ticks``),
and what each holds in the world is shown on ``/metrics`` (``dispatch.holdings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from specguard.actions import Action
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.config.loading import LoadedRule
from specguard.dispatch import guards, planning
from specguard.dispatch.controller import Controller, Ended
from specguard.dispatch.describe import context_of, describe, waiting
from specguard.dispatch.holdings import Holdings
from specguard.dispatch.ticks import TICK_RETRY, Ticks, is_fatal
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.durations import format_wait
from specguard.store.commits import Guard
from specguard.store.database import Store, StoreError
from specguard.store.memory import StoreMemory
from specguard.store.records import ActionRun, Event, EventRecord, PlannedRun, RunMode, RunOutcome, RunStatus

log = logging.getLogger("specguard.dispatcher")

STORE_RETRY = 5.0  # seconds before a step the store refused is tried again
IN_FLIGHT_LOOK = 1.0  # seconds between looks while the runs that are due are being carried out
# What specguard_action_runs_total counts runs under. Each action's are exported from 0: a counter
# that first appears at 1 is an increase Prometheus never sees (increase() over it reads 0).
RUN_STATUSES = ("ok", "failed", "skipped", "deferred", "retry")


class Dispatcher:
    def __init__(
        self,
        store: Store,
        actions: Mapping[str, Action],
        dry_run: bool,
        metrics: DaemonMetrics,
        rules: Iterable[LoadedRule] = (),
        clock: Callable[[], float] | None = None,
    ):
        self.store = store
        self.metrics = metrics
        self.clock = clock or store.clock
        self.rules: dict[str, LoadedRule] = {}
        self.set_rules(rules)
        self.controller = Controller(store, self.clock, self._flag_ended)
        self._next_look: dict[str, float | None] = {}  # when each flag's controller wants to look again
        self._flag_tasks: dict[str, asyncio.Task[None]] = {}  # each flag's controller, at work aside
        self._flag_again: set[str] = set()  # flags to look at once more when their look is over
        self._flag_fatal: BaseException | None = None  # what ended a flag's task that no step saw
        self._stopping = False  # quiesce: no step after the one under way
        self._served = asyncio.Event()  # set once serve has returned
        # The runs that wait (deferred, or pending until a time), as /api/status shows them.
        self.waiting: list[dict[str, Any]] = []
        self._actions: dict[str, Action] = {}
        self._holdings = Holdings(store, metrics, lambda: self._actions)
        self.actions = dict(actions)
        self.dry_run = dry_run
        # Called after each run with (run, status, detail): how an embedding program (the demo)
        # shows what was done.
        self.on_run: list[Callable[[ActionRun, str, str], None]] = []
        self._in_flight: set[int] = set()  # runs being carried out now
        self._due = asyncio.Event()  # set when runs were recorded: the waiting may change
        self._ticked = asyncio.Event()  # set when an action's own work ended: its next time may change
        # Runs the guards held back, on the store's writer thread, to be logged and counted on
        # the event loop by the next run() (called once the events are stored).
        self._held: list[tuple[Event, PlannedRun]] = []
        self._aside: set[asyncio.Task[None]] = set()  # runs carried out beside their caller
        self._batches: set[asyncio.Task[None]] = set()  # of those, the runs of actions that tell
        self._lanes: dict[str, asyncio.Lock] = {}  # one run of an action at a time
        # Each action's own work, beside the rest; when one is over the serve loop looks again.
        self._ticks = Ticks(store, lambda: self._actions, self.clock, self._ticked.set)
        store.memory_listeners.append(self._memory_changed)

    @property
    def actions(self) -> dict[str, Action]:
        return self._actions

    @actions.setter
    def actions(self, actions: Mapping[str, Action]) -> None:
        # New instances (a reload): each may read its holding differently (another flag file),
        # and the gauges of an action no longer configured must go.
        self._holdings.mark([*self._actions, *actions])
        self._actions = dict(actions)
        for name, action in self._actions.items():
            for status in RUN_STATUSES:
                self.metrics.action_runs.labels(name, status)
            if isinstance(action, FeatureFlagAction):
                action.clock = self.clock
                action.wake = self.wake

    def set_rules(self, rules: Iterable[LoadedRule]) -> None:
        """The rules as configured now (disabled ones included): which series may hold a flag,
        and which deferred runs still answer something."""
        self.rules = {item.name: item for item in rules}

    def _memory_changed(self, action: str) -> None:
        self._holdings.mark([action])

    async def show_holdings(self, names: Sequence[str] | None = None) -> None:
        """Show on /metrics what the actions ``names`` (default: all) hold now, from the store."""
        await self._holdings.show(names)

    @property
    def guard(self) -> Guard:
        """The guards, for the store to apply in the transaction that records an event."""
        check = partial(guards.check, actions=self.actions)

        def guard(db: Any, event: Event, planned: PlannedRun) -> PlannedRun:
            decided = check(db, event, planned)
            if decided.status in (RunStatus.SKIPPED, RunStatus.DEFERRED):
                self._held.append((event, decided))  # list.append: one step under the GIL
            return decided

        return guard

    def _report_held(self) -> None:
        held, self._held = self._held, []
        for event, run in held:
            what = "not running" if run.status == RunStatus.SKIPPED else "not running yet"
            log.info("%s %s: %s %s (%s)", event.rule, event.kind.value, what, run.action, run.reason)
            self.metrics.action_runs.labels(run.action, str(run.status)).inc()

    def record(self, item: LoadedRule, event: Event) -> EventRecord:
        """Decide what to do about ``event`` (nothing runs yet; the guards have the last word
        when it is stored)."""
        summary, annotations = describe(item, event)
        runs = planning.planned_runs(item, event, self.actions, self.dry_run)
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

    async def run(self, ids: Sequence[int] | None = None, wait: bool = True) -> None:
        """Bring the flags in line with the rules' states, then carry out pending runs that are
        due (``ids``, or every unfinished one), beside the caller: in their order, one at a time
        per action (a long-running action's each on its own). ``wait``: until they and the runs
        already under way are over (but a long-running action's); an evaluation round does not
        wait."""
        self._report_held()
        self.reconcile()
        batch: list[ActionRun] = []
        for run in await self.store.runs_to_do(ids, now=self.clock()):
            if run.id in self._in_flight:
                continue  # carried out by another caller right now
            action = self.actions.get(run.action)
            if action is not None and action.reconciled:
                continue  # the controller's
            self._in_flight.add(run.id)
            if action is not None and action.long_running:
                self._beside(self._run_aside([run], lanes=False))
            else:
                batch.append(run)
        if batch:
            task = self._beside(self._run_aside(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)
        if wait and self._batches:  # those under way too: a round's, started before this call
            await asyncio.wait(list(self._batches))
        self._due.set()  # restores may have been recorded, or put off: the waiting changes

    def _beside(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._aside.add(task)
        task.add_done_callback(self._aside.discard)
        return task

    async def _run_aside(self, runs: Sequence[ActionRun], lanes: bool = True) -> None:
        try:
            for run in runs:
                async with (
                    self._lanes.setdefault(run.action, asyncio.Lock()) if lanes else contextlib.nullcontext()
                ):
                    await self._run_one(run)
        except StoreError as exc:  # left in the store as they were: carried out at a later step
            log.debug("runs wait for the store: %s", exc)
        finally:
            for run in runs:
                self._in_flight.discard(run.id)
            self._due.set()

    async def stop(self) -> None:
        """Cancel the long runs carried out aside: they stay 'running' in the store and are
        carried out again (the action resumes its journal) at the next start."""
        tasks = [*self._aside, *self._flag_tasks.values()]  # a flag cut short is 'unknown': done again
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._ticks.stop()  # an outbox delivery cut short is tried again (it looks first)

    def wake(self) -> None:
        """Look again now: an action was given work of its own (a report to post), a round was
        evaluated (a flag may be wanted otherwise), a ladder's change ended."""
        self._due.set()

    def reconcile(self) -> None:
        """Each feature flag made what the rules' states say it should be (nothing in a dry run),
        beside the rest: a slow flag API, a reload command or a canary never holds an evaluation
        round, a notice or another flag back. A flag looked at already is looked at once more
        when it is done, so that no state it has not seen is missed."""
        if self.dry_run:
            return
        for name, action in list(self.actions.items()):
            if not isinstance(action, FeatureFlagAction):
                continue
            if name in self._flag_tasks:
                self._flag_again.add(name)
                continue
            task = asyncio.get_running_loop().create_task(self._reconcile_flag(name))
            self._flag_tasks[name] = task
            task.add_done_callback(partial(self._flag_done, name))
        for gone in set(self._next_look) - set(self.actions):
            del self._next_look[gone]

    def _flag_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._flag_tasks.get(name) is task:
            del self._flag_tasks[name]
        if not task.cancelled() and is_fatal(task.exception()):
            self._flag_fatal = task.exception()  # a task done before settled() looked: kept for it

    async def _reconcile_flag(self, name: str) -> None:
        while True:
            self._flag_again.discard(name)
            action = self.actions.get(name)
            if not isinstance(action, FeatureFlagAction):
                return
            acted = False
            try:
                look, acted = await self.controller.reconcile(action, self.rules)
            except StoreError as exc:
                log.debug("fallback %s waits for the store: %s", name, exc)
                look = self.clock() + STORE_RETRY
            except Exception:  # one flag's trouble must not stop the others, or the loop
                log.exception(
                    "fallback %s: could not be brought in line; tried again in %gs", name, TICK_RETRY
                )
                look = self.clock() + TICK_RETRY
            self._next_look[name] = look
            # After a change the next may be due at once (a restore planned once an engage is done).
            if not (acted or name in self._flag_again) or self._stopping:
                break
        self._due.set()  # the serve loop waits for the flag's next look

    async def settled(self) -> None:
        """Wait until every flag's controller has looked at what was there when this was called.
        What ended a controller's task that is not an error of its own (the process being stopped
        by a BaseException) goes on to the caller."""
        while self._flag_tasks:
            ended = await asyncio.gather(*list(self._flag_tasks.values()), return_exceptions=True)
            for result in ended:
                if is_fatal(result):
                    self._flag_fatal = None
                    raise result  # type: ignore[misc]
        if self._flag_fatal is not None:
            fatal, self._flag_fatal = self._flag_fatal, None
            raise fatal

    async def recheck(self) -> None:
        """Deferred runs looked at again: admitted (then carried out), deferred on, or skipped."""
        await planning.recheck(self.store, self.actions, self.rules, self.dry_run, self.clock(), self.metrics)

    async def step(self, settle: bool = True) -> None:
        """One tick of the dispatcher's own: deferrals looked at again, the flags reconciled, due
        runs carried out, the actions' own work. ``settle``: also wait for the flags' controllers
        and the actions' own work (a test's tick; the serve loop waits for neither)."""
        await self.recheck()
        await self.run(wait=settle)
        if settle:
            await self.settled()
        await self.tick(wait=settle)
        self.waiting = await self.store.call(waiting)

    async def _flag_ended(self, flag: FeatureFlagAction, ended: Ended) -> None:
        """A flag's change ended (done, or to be tried again): counted, logged, told."""
        what = "restore" if ended.mode == RunMode.RESTORE else "engage"
        self.metrics.action_runs.labels(flag.name, ended.status).inc()
        if ended.status == "ok":
            log.info("action %s: %s: %s", flag.name, what, ended.detail)
        else:
            log.warning("action %s: %s not done yet: %s", flag.name, what, ended.detail)
        if not ended.run:
            return
        run = await self.store.run_of(ended.run)
        if run is None:
            return
        if ended.status == "ok" or ended.first_failure:
            status = "ok" if ended.status == "ok" else "failed"
            told = RunOutcome(
                run.rule, run.series, run.kind, run.action, run.mode, status, ended.detail, self.clock()
            )
            await self._tell_observers(told)
        for observer in self.on_run:
            observer(run, ended.status, ended.detail)

    async def tick(self, wait: bool = True) -> None:
        """Each action's own due work (a Slack outbox), beside the rest, one pass at a time per
        action. ``wait``: until the passes are over (a long-running action's aside: it may take
        minutes); the serve loop does not wait, and hears when each is over."""
        self._ticks.start()
        if wait:
            await self._ticks.wait(name for name, action in self.actions.items() if not action.long_running)

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
        """Carry out runs as they fall due (restores after their quiet period, retries, deferrals
        that ended), keep the flags in line, and the actions' own work; until cancelled or
        ``quiesce``."""
        holdings = asyncio.get_running_loop().create_task(self._holdings.serve())
        try:
            await self._serve()
        finally:
            holdings.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holdings

    async def quiesce(self, grace: float) -> None:
        """Stop serving once the step under way is over (its runs finish), waiting up to ``grace``
        seconds for it; whatever is cut off after that is still in the store for the next start."""
        self._stopping = True
        self._due.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._served.wait()
                await self.settled()  # a flag's change under way finishes, or is cut off at ``grace``
                if self._batches:  # so do the runs under way
                    await asyncio.wait(list(self._batches))

    async def _serve(self) -> None:
        try:
            await self._serve_steps()
        finally:
            self._served.set()

    async def _step_or_later(self) -> float | None:
        """A step; when the store cannot be written (a full disk, said by the daemon's rounds), the
        time to try again, every step being idempotent."""
        try:
            await self.step(settle=False)
        except StoreError as exc:
            log.debug("the dispatcher's step waits for the store: %s", exc)
            return self.clock() + STORE_RETRY
        return None

    async def _serve_steps(self) -> None:
        if self._stopping:
            return
        retry = await self._step_or_later()
        while not self._stopping:
            self._due.clear()  # before reading: a run recorded meanwhile wakes the wait below
            soonest = await self.next_wake(retry)
            wait = None if soonest is None else max(0.0, soonest - self.clock())
            if await self._sleep(wait) and not self._stopping:
                retry = await self._step_or_later()

    async def next_wake(self, retry: float | None = None) -> float | None:
        """When the next step is due (None: nothing waits): a run falling due, an action's own work,
        a flag's next look, or ``retry``. The serve loop sleeps until then; a backtest moves there."""
        try:
            due = await self.store.next_due()
        except StoreError:
            due = self.clock() + STORE_RETRY
        if due is not None and due <= self.clock() and self._in_flight:
            due = self.clock() + IN_FLIGHT_LOOK  # under way, or waiting for its action: not at once
        wants = [due, retry, self._ticks.next, *self._next_look.values()]
        return min((t for t in wants if t is not None), default=None)

    async def _sleep(self, wait: float | None) -> bool:
        """Up to ``wait`` seconds, until woken; False when only an action's own work ended meanwhile
        (its next due time is read again, no step is due for it)."""
        self._ticked.clear()
        woken = asyncio.ensure_future(self._due.wait())
        ticked = asyncio.ensure_future(self._ticked.wait())
        try:
            done, _ = await asyncio.wait({woken, ticked}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            ticked.cancel()
        return woken in done or not done

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
        outcomes = await self._outcomes(run.event_id) if action.observes else []
        ctx = context_of(run, StoreMemory(self.store, run.action), outcomes)
        await self.store.start_run(run.id)
        retry_after: float | None = None
        page = False
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that arrives as the action finishes, and a stop would then hang.
            async with asyncio.timeout(action.timeout):
                outcome = await (action.restore(ctx) if run.mode == "restore" else action.run(ctx))
            status, detail = ("ok" if outcome.ok else "failed"), outcome.detail
            retry_after = None if outcome.ok else outcome.retry_after
            page = outcome.page
        except TimeoutError:
            status, detail = "failed", f"timed out after {action.timeout:g}s"
        except Exception as exc:  # an action's bug must not stop the daemon
            log.exception("action %s failed for %s", run.action, run.rule)
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
        what = "restore" if run.mode == "restore" else run.kind
        if retry_after is not None:
            # Not done yet (a canary saw acceptance still low): the run waits, and is tried again.
            await self.store.retry_run(run.id, detail, self.clock() + retry_after)
            self.metrics.action_runs.labels(run.action, "retry").inc()
            log.warning(
                "action %s for %s %s: not yet, again in %s: %s",
                run.action,
                run.rule,
                what,
                format_wait(retry_after),
                detail,
            )
            self._due.set()
            if page:  # not over, but on-call must hear of it now (the fleet's store is down)
                told = RunOutcome(run.rule, run.series, run.kind, run.action, run.mode, "deferred", detail,
                                  self.clock(), page=True)  # fmt: skip
                await self._tell_observers(told)
            for observer in self.on_run:
                observer(run, "retry", detail)
            return
        await self.store.finish_run(run.id, status, detail)
        self.metrics.action_runs.labels(run.action, status).inc()
        ended = RunOutcome(
            run.rule, run.series, run.kind, run.action, run.mode, status, detail, self.clock(), page=page
        )
        await self._tell_observers(ended)
        for observer in self.on_run:
            observer(run, status, detail)
        if status != "ok":
            log.warning("action %s for %s %s failed: %s", run.action, run.rule, what, detail)
        else:
            log.info("action %s for %s %s: %s", run.action, run.rule, what, detail)
