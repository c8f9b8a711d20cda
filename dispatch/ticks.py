"""Each action's own work (``Action.tick``: a Slack outbox delivered, a restart resumed), carried out
beside the dispatcher's loop, one pass at a time per action: a dependency that hangs holds back
that action's own work alone, never another action, a due run, a flag's controller or the loop.
A pass asked for while one is under way is made once more when it is over, so that work queued
meanwhile is not left until its time comes round again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

from specguard.actions import Action
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

log = logging.getLogger("specguard.dispatcher")

TICK_RETRY = 30.0  # seconds before an action's own work that raised is tried again


class Ticks:
    def __init__(
        self,
        store: Store,
        actions: Callable[[], Mapping[str, Action]],
        clock: Callable[[], float],
        done: Callable[[], None],
    ) -> None:
        self.store = store
        self._actions = actions  # the actions as configured now (a reload replaces them)
        self.clock = clock
        self._done = done  # told when a pass is over: the next due time may have changed
        self.due: dict[str, float] = {}  # when each action next has work of its own
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._fatal: BaseException | None = None  # what ended a pass that is not an error of its own

    @property
    def next(self) -> float | None:
        return min(self.due.values(), default=None)

    def start(self) -> None:
        """A pass of every action's own work, each beside the rest (one more after the one under way)."""
        actions = self._actions()
        for name in actions:
            if name in self._tasks:
                self._again.add(name)
                continue
            task = asyncio.get_running_loop().create_task(self._passes(name))
            self._tasks[name] = task
            task.add_done_callback(lambda t, name=name: self._ended(name, t))  # type: ignore[misc]
        for gone in set(self.due) - set(actions):
            del self.due[gone]

    async def wait(self, names: Iterable[str]) -> None:
        """Until the passes of ``names`` under way are over; what ended one that is not an error of
        its own (the process being stopped by a BaseException) goes on to the caller."""
        tasks = [self._tasks[name] for name in names if name in self._tasks]
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if is_fatal(result):
                self._fatal = None
                raise result  # type: ignore[misc]
        if self._fatal is not None:
            fatal, self._fatal = self._fatal, None
            raise fatal

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _ended(self, name: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(name) is task:
            del self._tasks[name]
        if not task.cancelled() and is_fatal(task.exception()):
            self._fatal = task.exception()

    async def _passes(self, name: str) -> None:
        while True:
            self._again.discard(name)
            action = self._actions().get(name)
            if action is None:
                self.due.pop(name, None)
                return
            try:
                async with asyncio.timeout(action.timeout):
                    due = await action.tick(StoreMemory(self.store, name))
            except Exception:  # one action's trouble must not stop the others, or the loop
                log.exception("action %s: its own work failed; tried again in %gs", name, TICK_RETRY)
                due = self.clock() + TICK_RETRY
            if due is None:
                self.due.pop(name, None)
            else:
                self.due[name] = due
            if name not in self._again:
                break
        self._done()


def is_fatal(result: object) -> bool:
    """An end that is not an action's own error: the process is going (a BaseException)."""
    return isinstance(result, BaseException) and not isinstance(result, Exception | asyncio.CancelledError)
