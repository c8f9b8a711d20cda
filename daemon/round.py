"""The evaluation round: the scheduler runs one per interval over the rules of that interval, and
an Alertmanager delivery asks for one rule's evaluation at once. One rule's evaluation reads down:
``evaluation.evaluate_rule`` reads the rule's signal and has the engine judge it; what the engine
decided is stored, and only then handed to the dispatcher, which acts beside the round. A rule that
cannot be evaluated is said once per change; a store that failed is tried again at the next round."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence

from specguard.config.loading import LoadedRule
from specguard.daemon.alertmanager.book import Receipt
from specguard.daemon.evaluation import evaluate_rule, reading_of
from specguard.daemon.self_status import tell_status
from specguard.daemon.shared import Shared
from specguard.engine.states import Outcome
from specguard.rules.durations import format_duration
from specguard.sources.base import SourceResult
from specguard.store.database import StoreError
from specguard.store.records import SCHEDULE, SeriesState, State, Verdict

log = logging.getLogger("specguard")


class Rounds:
    """The rounds, and each rule's evaluation: one at a time per rule, its outcome stored before
    anything is acted on."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._locks: dict[str, asyncio.Lock] = {}  # one evaluation of a rule at a time
        self.first_done = asyncio.Event()  # every rule evaluated once since the start: READY=1
        self._unevaluated: set[str] = set()  # rules not yet evaluated since the start
        self._judged_at: dict[str, float] = {}  # when each rule's last evaluation began (monotonic)

    def interval_of(self, item: LoadedRule) -> float:
        """The interval ``item`` is evaluated at: its own, or the config's."""
        return item.every(self.shared.loaded.config.interval)

    def expect(self, names: Iterable[str]) -> None:
        """The rules to evaluate once before ``first_done`` (the start's)."""
        self._unevaluated = set(names)
        if not self._unevaluated:
            self.first_done.set()

    async def evaluate_round(self, interval: float | None = None) -> None:
        """Evaluate the enabled rules of one interval (all of them when ``interval`` is None)."""
        task = asyncio.current_task()
        assert task is not None
        self.shared.busy.add(task)
        try:
            await self._round(interval)
        except asyncio.CancelledError:
            # The stop waited its grace period for this round and cut it off: what it had not
            # stored is found again at the next start. Said once, by the stop.
            return
        finally:
            self.shared.busy.discard(task)

    async def _round(self, interval: float | None) -> None:
        shared = self.shared
        started = time.monotonic()
        rules = [
            r for r in shared.loaded.enabled_rules() if interval is None or self.interval_of(r) == interval
        ]
        if shared.store_error is not None:
            await self._retry_store()
        asked = time.monotonic()  # (ordered against the rules' evaluations: never by the wall clock)
        ahead = self._ask_ahead(rules)
        try:
            await self._each(rules, ahead, asked)
        finally:
            for task in ahead.values():  # a round cut off leaves nothing running
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # a reading no evaluation took is let go, said or not
        label = format_duration(interval) if interval else "all"
        shared.metrics.evaluation_duration.labels(label).observe(took := time.monotonic() - started)
        shared.overruns.ran(label, took, interval)
        shared.last_round = shared.clock()
        for each in [interval] if interval is not None else list(shared.last_round_of):
            shared.last_round_of[each] = shared.last_round
        shared.metrics.last_evaluation.set(shared.last_round)
        tell_status(shared)
        shared.dispatcher.wake()  # the flags are looked at against the states this round left

    def _ask_ahead(self, rules: Sequence[LoadedRule]) -> dict[str, asyncio.Task[SourceResult]]:
        """Each rule's reading asked for at once, when the source's answers come over the network
        (``reads_ahead``: Prometheus); the rules are still judged and stored one after another, in
        order, each as its answer comes, so the engine's work overlaps the source's. A source that
        answers from memory (the scrape source) is read as each rule is evaluated."""
        shared = self.shared
        if not getattr(shared.source, "reads_ahead", False):
            return {}
        ahead: dict[str, asyncio.Task[SourceResult]] = {}
        for item in rules:
            reading = reading_of(item, shared.source, shared.loaded.baseline, self.interval_of(item))
            if reading is not None:
                ahead[item.name] = asyncio.create_task(reading)
        return ahead

    async def _each(
        self, rules: Sequence[LoadedRule], ahead: Mapping[str, asyncio.Task[SourceResult]], asked: float
    ) -> None:
        shared = self.shared
        for item in rules:
            try:
                await self.evaluate_one(item, ahead=ahead.get(item.name), asked=asked)
            except StoreError as exc:
                shared.store_failed(str(exc))
            except Exception as exc:  # one rule's failure must not stop the others
                log.exception("rule %s: evaluation failed", item.name)
                shared.metrics.evaluations.labels(item.name, Verdict.ERROR.value).inc()
                self.note_error(item.name, f"evaluation failed: {type(exc).__name__}: {exc}")
            finally:
                self._evaluated(item.name)  # a failed evaluation is a verdict too: it must not hold READY

    async def evaluate_one(
        self,
        item: LoadedRule,
        trigger: str = SCHEDULE,
        touched: Sequence[Receipt] | None = None,
        ahead: Awaitable[SourceResult] | None = None,
        asked: float = 0.0,
    ) -> None:
        """``ahead``: its reading, asked for already at ``asked`` (``time.monotonic``, ``_ask_ahead``)."""
        # The schedule and a webhook delivery may both want the rule: one after the other, each
        # on the states the other left.
        lock = self._locks.setdefault(item.name, asyncio.Lock())
        async with lock:
            if ahead is not None and self._judged_at.get(item.name, -math.inf) >= asked:
                ahead = None  # judged since on a fresher reading (a delivery's): read again, never back
            self._judged_at[item.name] = time.monotonic()
            await self._evaluate_locked(item, self.shared.clock(), trigger, touched, ahead)

    async def _evaluate_locked(
        self,
        item: LoadedRule,
        now: float,
        trigger: str,
        touched: Sequence[Receipt] | None = None,
        ahead: Awaitable[SourceResult] | None = None,
    ) -> None:
        shared = self.shared
        previous = shared.states.get(item.name, {})
        outcome, result = await evaluate_rule(
            item,
            shared.source,
            shared.loaded.baseline,
            previous,
            now,
            self.interval_of(item),
            alerts=shared.alerts,
            trigger=trigger,
            touched=touched,
            ahead=ahead,
        )
        await self.settle(item, previous, outcome, result, now)

    async def settle(
        self,
        item: LoadedRule,
        previous: Mapping[str, SeriesState],
        outcome: Outcome,
        result: SourceResult,
        now: float,
    ) -> None:
        """What the engine decided of ``item`` at ``now`` (from ``previous``), stored, then handed to
        the dispatcher: the second half of an evaluation, which a backtest also runs for the
        evaluations its judging phase found events in."""
        shared = self.shared
        name = item.name
        partial = item.rule.alert_only  # an alert rule evaluates the series that can change
        for key in outcome.forgotten:
            old = previous.get(key)
            log.info(
                "%s: forgot series %s: no data for %s",
                name,
                key,
                format_duration(now - (old.last_seen or old.last_eval or now)) if old else "long",
                extra={"rule": name, "labels": dict(old.labels) if old else {}},
            )
        if result.error is not None:
            shared.metrics.source_errors.labels(shared.source.kind, "").inc()
        records = [shared.dispatcher.record(item, event) for event in outcome.events]
        # Nothing is decided until it is stored: if the store cannot be written, the states stay as
        # they were and the same transitions are found again once it can.
        if partial:
            pending = await shared.store.commit_series(
                name, outcome.states, outcome.forgotten, records, shared.dispatcher.guard
            )
            states = {**previous, **outcome.states}
            for key in outcome.forgotten:
                states.pop(key, None)
        else:
            pending = await shared.store.commit_evaluation(
                name, outcome.states, records, shared.dispatcher.guard
            )
            states = outcome.states
        shared.states[name] = states
        shared.rule_verdicts[name] = _rule_verdict(outcome, result)
        self._evaluated(name)  # before its actions run: they must not hold READY
        self.note_error(name, outcome.error)
        verdicts = list(outcome.verdicts.values()) or [Verdict.ERROR if outcome.error else Verdict.NO_DATA]
        for verdict in verdicts:
            shared.metrics.evaluations.labels(name, verdict.value).inc()
        counts = dict.fromkeys(State, 0)
        for series in states.values():
            counts[series.state] += 1
        for state, count in counts.items():
            shared.metrics.rule_series.labels(name, state.value).set(count)
        for record in records:
            event = record.event
            for observer in shared.on_event:
                observer(item, record)
            shared.metrics.events.labels(name, event.kind.value).inc()
            log.info(
                "%s: %s -> %s: %s%s",
                name,
                event.previous.value,
                event.kind.value,
                record.summary,
                "" if event.trigger == SCHEDULE else f" [{event.trigger}]",
                extra={
                    "rule": name,
                    "labels": dict(event.labels),
                    "value": event.value,
                    "trigger": event.trigger,
                },
            )
        if records:  # runs to carry out, and runs the guards held back to log
            await shared.dispatcher.run(pending, wait=False)  # carried out beside the round

    def _evaluated(self, name: str) -> None:
        """Rule ``name`` has been evaluated (stored, or failed) since the start: READY=1 once all have."""
        self._unevaluated.discard(name)
        if not self._unevaluated:
            self.first_done.set()

    def note_error(self, rule: str, error: str | None) -> None:
        """Why ``rule`` could not be evaluated (None: it could), logged when it changes."""
        errors = self.shared.rule_errors
        if error != errors.get(rule):
            if error:
                log.warning("rule %s: %s", rule, error)
            elif errors.get(rule):
                log.info("rule %s: evaluating again", rule)
        errors[rule] = error

    async def _retry_store(self) -> None:
        """Once the store failed, only a real write says it works again: a rule with nothing to
        change commits nothing, and succeeds even on a full disk."""
        shared = self.shared
        try:
            await shared.store.check_writable()
        except StoreError as exc:
            shared.store_failed(str(exc))
            return
        log.info("the state store can be written again: %s", shared.store.path)
        shared.store_error = None
        try:
            await shared.dispatcher.run(wait=False)  # runs recorded before the store failed, still to do
        except StoreError as exc:
            shared.store_failed(str(exc))


def _rule_verdict(outcome: Outcome, result: SourceResult) -> tuple[str, str | None]:
    """What a rule without series says, and why: an error, warming up, or no data (with the source's
    errors, which are usually the reason)."""
    if outcome.error is not None:
        return Verdict.ERROR.value, outcome.error
    if result.warming:
        return Verdict.WARMING_UP.value, "waiting for samples from " + ", ".join(sorted(result.warming))
    reason = result.detail.get("scrape_errors")
    return Verdict.NO_DATA.value, f"no data; scrape failed: {reason}" if reason else "no data"
