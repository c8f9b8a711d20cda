"""The fallback converges: a stateful property test of the real dispatcher, guards, store, the
feature_flag action and the slack action (on a loopback Slack Web API), over a fake clock, a flag
API that is up, down, slow or answering 5xx, a canary that passes or not, silences, reloads that
remove, rename, disable or change rules, and the daemon killed at any store transaction or flag
write and started again.

After every step:

- I1: once the flag API and the canary have answered for one retry interval, the flag is engaged
  exactly when it should be: some eligible, unsilenced series fires; or the flag is engaged and an
  eligible series (silenced or not) fires, or the quiet period after the last one is running;
- I2: the flag is never restored while an eligible series fires;
- I3: engagements within the flag's budget in every window; one Slack thread per incident;
- I4: nothing the store recorded as done is done again after a restart (no engage written while
  the store has it confirmed engaged, no second top-level Slack message for one incident).

An eligible series: its rule is in the config, enabled, and names the flag in its actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from specguard.actions.base import Action
from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.feature_flag.backends import BackendError
from specguard.actions.feature_flag.canary import CanaryResult
from specguard.actions.slack import SlackAction, SlackParams
from specguard.config.loading import LoadedRule
from specguard.dispatch import Dispatcher, silences
from specguard.engine.states import series_key
from specguard.metrics.registry import DaemonMetrics
from specguard.rules.schema import Rule
from specguard.sim import slack_api
from specguard.store.database import Store
from specguard.store.records import Event, SeriesState, State

TICK = 10.0  # the daemon's evaluation interval
QUIET = 30.0  # the flag's quiet period
RETRY = 20.0  # the longest wait before a failed write or canary is tried again
SETTLED = RETRY + 2 * TICK  # answered this long: the flag must be as it should
GROUP_WAIT = 5.0
START = 1_800_000_000.0
RULE_NAMES = ("alpha", "beta")
BUDGET = {"runs": 1, "per": 300}
INSTANCES = ("h1", "h2")


class Killed(BaseException):
    """The process dies here (SIGKILL): nothing after this line runs."""


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


@dataclass
class FlagWorld:
    """The flag as a router reads it, and the API in front of it."""

    clock: Clock
    value: str = "restored"  # engaged | restored
    mode: str = "up"  # up | down | slow | 5xx
    kill: str | None = None  # before | after: the next write kills the daemon there
    writes: list[tuple[float, str, bool]] = field(default_factory=list)  # (at, value, changed)
    # Called at each write with its value, before it is applied: the invariants that hold then.
    on_write: list[Callable[[str], None]] = field(default_factory=list)

    def read(self) -> str | None:
        if self.mode != "up":
            raise BackendError(f"flag API {self.mode}")
        return self.value


class FakeBackend:
    confirms = True

    def __init__(self, world: FlagWorld, engage: Any, restore: Any) -> None:
        self.world = world
        self.values = {
            json.dumps(engage, sort_keys=True): "engaged",
            json.dumps(restore, sort_keys=True): "restored",
        }

    async def set(self, value: Any, what: str) -> str:
        world = self.world
        wanted = self.values[json.dumps(value, sort_keys=True)]
        if world.kill == "before":
            world.kill = None
            raise Killed
        if world.mode in ("down", "5xx"):
            raise BackendError(
                f"{what}: the flag API {'refused the connection' if world.mode == 'down' else 'answered 503'}"
            )
        for check in world.on_write:
            check(wanted)
        world.writes.append((world.clock(), wanted, world.value != wanted))
        world.value = wanted
        if world.kill == "after":
            world.kill = None
            raise Killed
        if world.mode == "slow":
            raise BackendError(f"{what}: the flag API did not answer within 10s")
        return f"set to {wanted}"

    async def read(self, engage: Any, restore: Any) -> str | None:
        return self.world.read()


@dataclass
class FakeCanary:
    ok: bool = True

    async def probe(self) -> CanaryResult:
        if self.ok:
            return CanaryResult(
                True, "canary: acceptance 0.71 over 120 draft tokens, at or above 0.5", 0.71, 120
            )
        return CanaryResult(False, "canary: acceptance 0.21 over 120 draft tokens, below 0.5", 0.21, 120)


def loaded_rule(name: str, actions: list[str], enabled: bool = True, index: int = 0) -> LoadedRule:
    raw = {
        "name": name,
        "signal": "acceptance_rate",
        "condition": "< 0.4",
        "actions": actions,
        "enabled": enabled,
    }
    return LoadedRule(Rule.model_validate(raw), "rules.yaml", 2 + 8 * index, index)


# What a reload may do to the rule `beta`.
RELOADS = ("original", "removed", "renamed", "disabled", "no_fallback")


def config(variant: str) -> dict[str, LoadedRule]:
    rules = {"alpha": loaded_rule("alpha", ["fallback", "oncall"])}
    if variant == "original":
        rules["beta"] = loaded_rule("beta", ["fallback", "oncall"], index=1)
    elif variant == "renamed":
        rules["beta2"] = loaded_rule("beta2", ["fallback", "oncall"], index=1)
    elif variant == "disabled":
        rules["beta"] = loaded_rule("beta", ["fallback", "oncall"], enabled=False, index=1)
    elif variant == "no_fallback":
        rules["beta"] = loaded_rule("beta", ["oncall"], index=1)
    return rules


def enabled(rules: dict[str, LoadedRule]) -> set[str]:
    """The rules whose series the daemon keeps: configured and enabled."""
    return {name for name, item in rules.items() if item.rule.enabled}


class Host:
    """The daemon's dispatching half, as `specguard run` wires it, driven step by step."""

    def __init__(self, path: Path, world: FlagWorld, canary: FakeCanary, slack_url: str, tmp: Path,
                 budget: dict[str, Any] | None) -> None:  # fmt: skip
        self.path = path
        self.world = world
        self.canary = canary
        self.slack_url = slack_url
        self.tmp = tmp
        self.budget = budget
        self.kill_after: int | None = None  # store transactions before the process dies
        self.store: Store | None = None
        self.dispatcher: Dispatcher | None = None
        self.rules: dict[str, LoadedRule] = {}
        self.firing: set[tuple[str, str]] = set()  # (rule, instance) the traffic makes fire now

    def actions(self) -> dict[str, Action]:
        flag = FeatureFlagParams.model_validate(
            {
                "type": "feature_flag",
                "file": {"path": str(self.tmp / "flag.json"), "engage": {"speculative": False}, "restore": {"speculative": True}},
                "quiet_period": QUIET,
                "restore_backoff": 10,
                "restore_max_backoff": RETRY,
                "retry_backoff": 5,
                "retry_max_backoff": RETRY,
                "canary": {"url": "http://127.0.0.1:9", "min_acceptance": 0.5},
                **({"budget": self.budget} if self.budget else {}),
            }
        )  # fmt: skip
        fallback = FeatureFlagAction("fallback", flag)
        fallback.backend = FakeBackend(self.world, {"speculative": False}, {"speculative": True})  # type: ignore[assignment]
        fallback.canary = self.canary  # type: ignore[assignment]
        (self.tmp / "slack-token").write_text(slack_api.TOKEN)
        oncall = SlackAction(
            "oncall",
            SlackParams.model_validate(
                {
                    "type": "slack",
                    "token": {"file": str(self.tmp / "slack-token")},
                    "channel": "C0ONCALL",
                    "base_url": self.slack_url,
                    "group_wait": GROUP_WAIT,
                    "backoff": 5,
                    "max_backoff": 20,
                    "host": "h",
                }
            ),
        )
        return {"fallback": fallback, "oncall": oncall}

    async def start(self, rules: dict[str, LoadedRule]) -> None:
        self.rules = rules
        store = Store(self.path, clock=self.world.clock)
        await store.open()
        real_call = store._call

        async def call(fn: Any, synced: bool = True) -> Any:
            if self.kill_after is not None:
                if self.kill_after == 0:
                    self.kill_after = None
                    raise Killed
                self.kill_after -= 1
            return await real_call(fn, synced)

        store._call = call  # type: ignore[method-assign]
        self.store = store
        self.dispatcher = Dispatcher(store, self.actions(), False, DaemonMetrics(), rules=rules.values())
        await store.forget_rules(enabled(rules))
        await self.dispatcher.run()
        await self.tick()

    async def stop(self) -> None:
        """The process ends: whatever it had under way (a flag's controller) ends with it."""
        if self.dispatcher is not None:
            await self.dispatcher.stop()
        if self.store is not None:
            store, self.store = self.store, None
            self.kill_after = None
            await store.close()

    async def tick(self) -> None:
        """One round: the rules evaluated (as the engine would, on what the traffic says now),
        then the dispatcher's step."""
        assert self.dispatcher is not None
        await self.evaluate()
        await self.dispatcher.step()

    async def reload(self, rules: dict[str, LoadedRule]) -> None:
        assert self.dispatcher is not None and self.store is not None
        self.rules = rules
        self.dispatcher.actions = self.actions()
        self.dispatcher.set_rules(rules.values())
        await self.store.forget_rules(enabled(rules))
        await self.tick()

    async def evaluate(self) -> None:
        """Each configured series whose stored state differs from what the traffic says (``firing``)
        moves, with its event, as the engine moves it: a transition not stored (the process died)
        is found again at the next round."""
        assert self.dispatcher is not None and self.store is not None
        stored = await self.store.load_states()
        at = self.world.clock()
        for name, item in self.rules.items():
            if not item.rule.enabled:
                continue
            for instance in INSTANCES:
                labels = {"instance": instance}
                key = series_key(labels)
                was = stored.get(name, {}).get(key)
                fires = (name, instance) in self.firing
                if fires == (was is not None and was.state is State.FIRING):
                    continue
                if not fires and was is None:
                    continue
                kind = State.FIRING if fires else State.RESOLVED
                previous = State.PENDING if fires else State.FIRING
                event = Event(name, key, labels, kind, previous, at, 0.2 if fires else 0.7, 0.4, since=at)
                state = SeriesState(labels=labels, state=kind, since=at, last_eval=at)
                record = self.dispatcher.record(item, event)
                pending = await self.store.commit_series(
                    name, {key: state}, [], [record], self.dispatcher.guard
                )
                await self.dispatcher.run(pending)

    async def silence(self, rule_name: str, starts: float, ends: float) -> int:
        assert self.store is not None
        made = await self.store.call(
            lambda db: silences.add(db, rule_name, {}, starts, ends, "deploying a new draft", "ops", starts)
        )
        return made.id

    async def expire(self, silence_id: int, at: float) -> bool:
        assert self.store is not None
        await self.store.call(lambda db: silences.end(db, silence_id, at))
        return True

    async def confirmed(self) -> Any:
        assert self.store is not None
        return await self.store.memory_read("fallback", "flag")


@dataclass
class SilenceModel:
    id: int
    rule: str
    starts: float
    ends: float

    def active(self, at: float) -> bool:
        return self.starts <= at < self.ends


class Convergence(RuleBasedStateMachine):
    """Two rules share the flag `fallback` and page `oncall`."""

    budget: dict[str, Any] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.patch = mock.patch("time.time", self.clock)
        self.patch.start()
        self.tmp = Path(TMP.mkdtemp())
        self.slack_ctx = slack_api.running()
        self.slack = self.loop.run_until_complete(self.slack_ctx.__aenter__())
        self.world = FlagWorld(self.clock)
        self.world.on_write.append(self._no_restore_while_firing)
        self.world.on_write.append(self._nothing_confirmed_is_written_again)
        self.canary = FakeCanary()
        self.host = Host(
            self.tmp / "state" / "specguard.db",
            self.world,
            self.canary,
            self.slack.url,
            self.tmp,
            self.budget,
        )
        self.variant = "original"
        self.firing: dict[tuple[str, str], float] = {}  # (rule, instance) -> fired at
        self.silences: list[SilenceModel] = []
        self.last_end: float | None = None  # when the last eligible series stopped firing
        self.api_since = self.clock.now  # the flag API answering since
        self.canary_since = self.clock.now  # the canary passing since
        self.restarts = 0
        self.violations: list[str] = []
        self.config_since = self.clock.now  # the rules as they are since

    # --- the model -------------------------------------------------------------------------------

    def eligible(self, name: str) -> bool:
        item = self.host.rules.get(name)
        return item is not None and item.rule.enabled and "fallback" in item.rule.actions

    def silenced(self, name: str, at: float) -> bool:
        return any(s.rule == name and s.active(at) for s in self.silences)

    def firing_eligible(self) -> list[tuple[str, str]]:
        return [key for key in self.firing if self.eligible(key[0])]

    def should_be_engaged(self, engaged: bool, now: float) -> bool:
        holding = self.firing_eligible()
        if any(not self.silenced(name, now) for name, _ in holding):
            return True
        if not engaged:
            return False
        if holding:
            return True
        if self.last_end is not None and now < self.last_end + QUIET:
            return True
        return not self.canary.ok

    def _track_end(self) -> None:
        if self.firing_eligible():
            self.last_end = None
        elif self.last_end is None:
            self.last_end = self.clock.now

    def _nothing_confirmed_is_written_again(self, value: str) -> None:
        with contextlib.closing(sqlite3.connect(self.host.path)) as db:
            row = db.execute(
                "SELECT value FROM action_memory WHERE action = 'fallback' AND key = 'flag'"
            ).fetchone()
        state = json.loads(row[0]).get("state") if row else "restored"
        if state == value:
            self.violations.append(
                f"I4: {value} written at {self.clock.now - START:g}s while the store has it confirmed"
            )

    def _no_restore_while_firing(self, value: str) -> None:
        if value == "restored" and self.firing_eligible():
            self.violations.append(
                f"I2: restored at {self.clock.now - START:g}s while {self.firing_eligible()} fire"
            )

    def run(self, step: Coroutine[Any, Any, None]) -> None:
        """One step of the daemon; a Killed is the process dying: it is started again."""
        try:
            self.loop.run_until_complete(step)
        except Killed:
            self.revive()

    def revive(self) -> None:
        """Started again after a kill; a kill during the start is one more start."""
        while True:
            self.restarts += 1
            self.loop.run_until_complete(self.host.stop())
            try:
                self.loop.run_until_complete(self.host.start(dict(self.host.rules)))
                return
            except Killed:
                continue

    # --- steps -----------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.run(self.host.start(config("original")))

    @rule(name=st.sampled_from(("alpha", "beta", "beta2")), instance=st.sampled_from(INSTANCES))
    def fire(self, name: str, instance: str) -> None:
        if name not in self.host.rules or (name, instance) in self.firing:
            return
        self.firing[(name, instance)] = self.clock.now
        self.host.firing.add((name, instance))
        self._track_end()
        self.run(self.host.tick())

    @rule(data=st.data())
    def resolve(self, data: st.DataObject) -> None:
        if not self.firing:
            return
        name, instance = data.draw(st.sampled_from(sorted(self.firing)))
        del self.firing[(name, instance)]
        self.host.firing.discard((name, instance))
        self._track_end()
        self.run(self.host.tick())

    @rule(ticks=st.integers(1, 24))
    def wait(self, ticks: int) -> None:
        for _ in range(ticks):
            self.clock.now += TICK
            self.run(self.host.tick())

    @rule(mode=st.sampled_from(("up", "down", "slow", "5xx")))
    def flag_api(self, mode: str) -> None:
        if mode != self.world.mode:
            self.world.mode = mode
            self.api_since = self.clock.now
        self.run(self.host.tick())

    @rule(ok=st.booleans())
    def canary_sees(self, ok: bool) -> None:
        if ok != self.canary.ok:
            self.canary.ok = ok
            self.canary_since = self.clock.now

    @rule(name=st.sampled_from(("alpha", "beta")), minutes=st.integers(1, 30))
    def silence(self, name: str, minutes: int) -> None:
        ends = self.clock.now + 60 * minutes
        made: list[int] = []

        async def add() -> None:
            made.append(await self.host.silence(name, self.clock.now, ends))

        self.run(add())
        if made:  # stored (a kill may come before)
            self.silences.append(SilenceModel(made[0], name, self.clock.now, ends))
        self.run(self.host.tick())

    @precondition(lambda self: any(s.active(self.clock.now) for s in self.silences))
    @rule()
    def expire_silence(self) -> None:
        silence = next(s for s in reversed(self.silences) if s.active(self.clock.now))
        done: list[bool] = []

        async def expire() -> None:
            done.append(await self.host.expire(silence.id, self.clock.now))

        self.run(expire())
        if done:
            silence.ends = self.clock.now
        self.run(self.host.tick())

    @rule(variant=st.sampled_from(RELOADS))
    def reload(self, variant: str) -> None:
        rules = config(variant)
        # a rule no longer configured is forgotten with its series, as the daemon forgets them
        for key in [k for k in self.firing if k[0] not in rules]:
            del self.firing[key]
            self.host.firing.discard(key)
        if variant != self.variant:
            self.config_since = self.clock.now
        self.variant = variant
        self.host.rules = rules
        self._track_end()
        self.run(self.host.reload(rules))

    @rule(point=st.sampled_from(("before", "after")))
    def kill_at_the_next_write(self, point: str) -> None:
        self.world.kill = point

    @rule(transactions=st.integers(0, 6))
    def kill_at_a_store_transaction(self, transactions: int) -> None:
        self.host.kill_after = transactions

    @rule()
    def restart(self) -> None:
        self.revive()

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def the_flag_is_as_it_should_be(self) -> None:
        assert not self.violations, self.violations[0]
        now = self.clock.now
        if self.world.mode != "up" or now - self.api_since < SETTLED:
            return
        if not self.canary.ok or now - self.canary_since < SETTLED:
            return
        engaged = self.world.value == "engaged"
        wanted = self.should_be_engaged(engaged, now)
        if wanted and not engaged and self.budget is not None and self._held_back_by_a_guard(now):
            return  # a cooldown or the budget holds the engage back: deferred, with its reason
        assert engaged == wanted, (
            f"I1: at {now - START:g}s the flag is {self.world.value}, it should be "
            f"{'engaged' if wanted else 'restored'}: firing {sorted(self.firing)}, config {self.variant}, "
            f"silences {[(s.rule, s.starts - START, s.ends - START) for s in self.silences if s.active(now)]}, "
            f"last end {None if self.last_end is None else self.last_end - START}"
        )

    @invariant()
    def one_thread_per_incident(self) -> None:
        parents = [m for m in self.slack.posted() if not m.get("thread_ts")]
        outbox = self.loop.run_until_complete(self._outbox())
        threads = {r.get("ts") for r in outbox.get("incidents", {}).values() if r.get("ts")}
        orphans = [m["ts"] for m in parents if m["ts"] not in threads]
        assert not orphans, f"I3/I4: {len(orphans)} top-level Slack message(s) belong to no incident's thread"

    @invariant()
    def each_incident_is_paged_once_it_may_be(self) -> None:
        """An incident firing unsilenced, its rule unchanged, for a group wait and two ticks has its
        Slack thread (a silenced page is sent when the silence ends, if it still fires)."""
        now = self.clock.now
        window = GROUP_WAIT + 2 * TICK
        if now - self.config_since < window:
            return
        outbox = self.loop.run_until_complete(self._outbox())
        with contextlib.closing(sqlite3.connect(self.host.path)) as db:
            for (name, instance), since in sorted(self.firing.items()):
                item = self.host.rules.get(name)
                if now - since < window or item is None or not item.rule.enabled:
                    continue
                if any(s.rule == name and s.starts < now and s.ends > now - window for s in self.silences):
                    continue
                series = series_key({"instance": instance})
                event = db.execute(
                    "SELECT max(id) FROM events WHERE rule = ? AND series = ? AND kind = 'firing'",
                    (name, series),
                ).fetchone()[0]
                incident = (outbox.get("incidents") or {}).get(f"{name}|{series}|{event}") or {}
                assert incident.get("ts"), (
                    f"I3: {name}{{{instance}}} fires unsilenced since {since - START:g}s, at {now - START:g}s "
                    f"on-call has not been paged (event {event})"
                )

    def _held_back_by_a_guard(self, now: float) -> bool:
        with contextlib.closing(sqlite3.connect(self.host.path)) as db:
            return bool(
                db.execute(
                    "SELECT 1 FROM action_runs WHERE action = 'fallback' AND status = 'deferred' AND not_before > ? "
                    "AND (reason LIKE 'budget:%' OR reason LIKE 'cooldown:%')",
                    (now,),
                ).fetchone()
            )

    async def _outbox(self) -> dict[str, Any]:
        path = self.host.path
        store = Store(path)
        await store.open()
        try:
            return await store.memory_read("oncall", "outbox") or {}
        finally:
            await store.close()

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.host.stop())
            self.loop.run_until_complete(self.slack_ctx.__aexit__(None, None, None))
        finally:
            self.patch.stop()
            self.loop.close()


class _Tmp:
    def __init__(self) -> None:
        self.root: Path | None = None
        self.count = 0

    def mkdtemp(self) -> str:
        assert self.root is not None
        self.count += 1
        made = self.root / f"run{self.count}"
        made.mkdir()
        return str(made)


TMP = _Tmp()


@pytest.fixture(autouse=True)
def _tmp_root(tmp_path: Path) -> None:
    TMP.root = tmp_path


Convergence.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TestConvergence = Convergence.TestCase


class BudgetedConvergence(Convergence):
    """The same, with the flag allowed one engagement per 5 minutes: engagements never exceed it,
    and an engage it holds back is deferred (recorded with the reason), then made once it allows."""

    budget = BUDGET

    @invariant()
    def engagements_stay_within_the_budget(self) -> None:
        changes = [at for at, value, changed in self.world.writes if changed and value == "engaged"]
        for index, at in enumerate(changes):
            inside = [t for t in changes[index:] if t < at + BUDGET["per"]]
            assert len(inside) <= BUDGET["runs"], (
                f"I3: {len(inside)} engagements from {at - START:g}s within {BUDGET['per']}s (budget {BUDGET})"
            )


BudgetedConvergence.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TestBudgetedConvergence = BudgetedConvergence.TestCase


# The sequences the state machine found on the dispatcher before the fallback was reconciled (each
# broke the invariant named), kept as explicit examples: they must hold on every change after.


class _Drawn:
    """A ``data`` argument that draws what it was given."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def draw(self, strategy: Any) -> Any:
        return self.value


def replay(*steps: tuple[str, dict[str, Any]]) -> None:
    machine = Convergence()
    try:
        machine.start()
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
            machine.the_flag_is_as_it_should_be()
            machine.one_thread_per_incident()
            machine.each_incident_is_paged_once_it_may_be()
    finally:
        machine.teardown()


def test_a_firing_under_a_silence_is_acted_on_once_the_silence_is_expired() -> None:
    """I1 broke: the firing's run was skipped 'silenced', and the flag never engaged."""
    replay(
        ("silence", {"name": "alpha", "minutes": 1}),
        ("fire", {"name": "alpha", "instance": "h1"}),
        ("expire_silence", {}),
        ("restart", {}),
        ("wait", {"ticks": 17}),
    )


def test_a_failed_engage_is_tried_again_once_the_flag_api_answers() -> None:
    """I1 broke: the engage failed while the API was down, and was never tried again."""
    replay(
        ("flag_api", {"mode": "down"}),
        ("fire", {"name": "alpha", "instance": "h1"}),
        ("flag_api", {"mode": "up"}),
        ("wait", {"ticks": 4}),
    )


def test_a_series_that_fired_silenced_holds_the_flag_when_another_lets_go() -> None:
    """I2 broke: alpha fired under a silence and never became a holder; beta's resolution restored
    the flag while alpha fired."""
    replay(
        ("silence", {"name": "alpha", "minutes": 1}),
        ("fire", {"name": "alpha", "instance": "h1"}),
        ("expire_silence", {}),
        ("fire", {"name": "beta", "instance": "h1"}),
        ("resolve", {"data": _Drawn(("beta", "h1"))}),
        ("wait", {"ticks": 3}),
    )


def test_firing_again_under_a_silence_in_the_quiet_period_calls_the_restore_off() -> None:
    """I2 broke: the silence held the firing back before the pending restore was called off."""
    replay(
        ("fire", {"name": "alpha", "instance": "h1"}),
        ("resolve", {"data": _Drawn(("alpha", "h1"))}),
        ("silence", {"name": "alpha", "minutes": 1}),
        ("fire", {"name": "alpha", "instance": "h1"}),
        ("wait", {"ticks": 6}),
    )


def test_a_slack_run_repeated_after_a_kill_keeps_one_thread() -> None:
    """I3/I4 broke: the process died after the notice was queued and before its run was marked
    done; the repeated run queued a second top-level message. (The kill lands at the transaction
    after the queueing: the 6th then, the 8th since the flag's controller writes its own.)"""
    replay(
        ("reload", {"variant": "no_fallback"}),
        ("kill_at_a_store_transaction", {"transactions": 7}),
        ("fire", {"name": "beta", "instance": "h1"}),
        ("wait", {"ticks": 1}),
    )


def test_a_kill_during_an_engage_the_controller_carried_out_unwatched_is_a_kill() -> None:
    """I1 broke: the engage under way when the silence was expired died at its write; the
    controller's task had ended before the step waited for it, so its end (the process dying) was
    lost, and the flag stayed restored though the store said an engage was under way."""
    replay(
        ("wait", {"ticks": 4}),
        ("kill_at_the_next_write", {"point": "before"}),
        ("silence", {"name": "alpha", "minutes": 1}),
        ("fire", {"name": "alpha", "instance": "h1"}),
        ("expire_silence", {}),
    )


def test_a_rule_enabled_again_while_its_series_fires_pages_on_call() -> None:
    """I3 broke: beta fired under a silence, its page deferred; disabled, the page was called off;
    enabled again while the series still fired, the series was still 'firing' in the store, so no
    new firing came and on-call was never paged. A disabled rule's series are now forgotten, as a
    removed rule's are: enabled again, the breach is a new firing."""
    replay(
        ("silence", {"name": "beta", "minutes": 1}),
        ("fire", {"name": "beta", "instance": "h1"}),
        ("reload", {"variant": "disabled"}),
        ("expire_silence", {}),
        ("restart", {}),
        ("reload", {"variant": "original"}),
        ("wait", {"ticks": 3}),
    )
