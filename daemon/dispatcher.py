"""The dispatcher: events -> action runs, through guards, recorded in the store.

Only ``firing`` and ``resolved`` events reach actions. Every decision not to run is recorded with
its reason (``shadow`` rule, global ``dry_run``). Runs are written to the store as ``pending`` in
the same transaction as the state change, then carried out; a run interrupted by a crash is
carried out after the restart (actions are idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from actions import Action, ActionContext
from daemon.engine import Event, State
from daemon.loading import LoadedRule
from daemon.selfmetrics import DaemonMetrics
from daemon.store import ActionRun, EventRecord, Store
from rules.templates import render

log = logging.getLogger("specguard.dispatcher")

ACTIONABLE = (State.FIRING, State.RESOLVED)


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
        else:
            summary = f"{rule.signal or 'expr'} = {value} ({rule.test}) on {where}"
    return summary, annotations


class Dispatcher:
    def __init__(self, store: Store, actions: Mapping[str, Action], dry_run: bool, metrics: DaemonMetrics):
        self.store = store
        self.actions = dict(actions)
        self.dry_run = dry_run
        self.metrics = metrics
        # Called after each run with (run, status, detail): how an embedding program (the demo)
        # shows what was done.
        self.on_run: list[Callable[[ActionRun, str, str], None]] = []

    def record(self, item: LoadedRule, event: Event) -> EventRecord:
        """Decide what to do about ``event`` (nothing runs yet)."""
        summary, annotations = describe(item, event)
        runs: list[tuple[str, str, str]] = []
        if event.kind in ACTIONABLE:
            for action in item.rule.actions:
                if item.rule.shadow:
                    runs.append((action, "skipped", "shadow rule: evaluated and recorded, never acts"))
                elif self.dry_run:
                    runs.append((action, "skipped", "dry run"))
                else:
                    runs.append((action, "pending", ""))
        for action, status, reason in runs:
            if status == "skipped":
                log.info("%s %s: not running %s (%s): %s", item.name, event.kind, action, reason, summary)
                self.metrics.action_runs.labels(action, status).inc()
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
        """Carry out pending runs (``ids``, or every unfinished one)."""
        for run in await self.store.runs_to_do(ids):
            await self._run_one(run)

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
        )
        await self.store.start_run(run.id)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that arrives as the action finishes, and a stop would then hang.
            async with asyncio.timeout(action.timeout):
                outcome = await action.run(ctx)
            status, detail = ("ok" if outcome.ok else "failed"), outcome.detail
        except TimeoutError:
            status, detail = "failed", f"timed out after {action.timeout:g}s"
        except Exception as exc:  # an action's bug must not stop the daemon
            log.exception("action %s failed for %s", run.action, run.rule)
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
        await self.store.finish_run(run.id, status, detail)
        self.metrics.action_runs.labels(run.action, status).inc()
        for observer in self.on_run:
            observer(run, status, detail)
        if status != "ok":
            log.warning("action %s for %s %s failed: %s", run.action, run.rule, run.kind, detail)
