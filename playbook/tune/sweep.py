"""The sweep: each k of ``--sweep`` made a rung through the running daemon (``POST
/api/ladder/NAME``: it writes the config, restarts vLLM, verifies the new k, rolls back, and keeps
the journal), measured at each concurrency, and the original k put back at the end, after a
failure, or when the run is stopped (the caller cancels ``run_sweep``'s task and then awaits
``restore``, which nothing cancels).

While it runs, the rules that name the ``vllm_restart`` action are silenced (``/api/silences``,
recorded in the store with the reason): a low-acceptance rule stepping k down at k = 5 would
change the server under the measurement. The silences are short and renewed before each phase, so a
sweep killed outright leaves none for long; at the end they are replaced by one that lasts the
rules' longest ``window`` + ``for``, until their windows no longer hold the sweep's readings."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from specguard.playbook.bench.runner import BenchError, Options
from specguard.playbook.tune.daemon import DaemonApi, DaemonError, Ladder
from specguard.playbook.tune.measure import Run, measure
from specguard.playbook.tune.progress import TuneProgress


class TuneError(Exception):
    """The sweep cannot start or cannot go on; the message says why (exit 2)."""


@dataclass(frozen=True)
class Plan:
    action: str
    original: int
    ks: tuple[int, ...]  # ascending
    order: tuple[int, ...]  # the k values in the order they are measured (0: the plain reference)
    concurrency: tuple[int, ...]

    @property
    def restarts(self) -> int:
        steps, current = 0, self.original
        for k in (*self.order, self.original):
            steps += k != current
            current = k
        return steps


def plan(ladder: Ladder, ks: Sequence[int], concurrency: Sequence[int], rung_reference: bool) -> Plan:
    """The order of the sweep: the k running now first (no restart), then the others from the
    largest down (the largest gives the prediction), the plain reference (rung 0) last. Raises
    TuneError for a k the ladder cannot reach: the daemon steps to rungs only."""
    wanted = sorted(set(ks))
    if not wanted or any(k <= 0 for k in wanted):
        raise TuneError("--sweep: give numbers of speculative tokens > 0, e.g. --sweep 1,3,5")
    missing = [k for k in wanted if k not in ladder.rungs]
    if missing:
        raise TuneError(
            f"--sweep: k={', '.join(map(str, missing))} {'is' if len(missing) == 1 else 'are'} not on the "
            f"ladder {list(ladder.rungs)} of vllm_restart action {ladder.action}: the daemon steps to rungs "
            "only; sweep rungs, or add them to the ladder (and reload the daemon)"
        )
    order = [ladder.k] if ladder.k in wanted else []
    order += [k for k in sorted(wanted, reverse=True) if k != ladder.k]
    if rung_reference:
        order = [0, *order] if ladder.k == 0 else [*order, 0]
    return Plan(ladder.action, ladder.k, tuple(wanted), tuple(order), tuple(concurrency))


class Hold:
    """The silences of the rules that would step k themselves, renewed phase by phase."""

    def __init__(self, api: DaemonApi, rules: Sequence[str], reason: str) -> None:
        self.api, self.rules, self.reason = api, tuple(rules), reason
        self.ids: list[int] = []

    async def renew(self, seconds: float) -> None:
        """Silence the rules for ``seconds`` from now, then end the silences this replaces."""
        old, self.ids = self.ids, []
        for rule in self.rules:
            self.ids.append(await self.api.silence(rule, seconds, self.reason))
        for silence_id in old:
            await self.api.expire(silence_id)


@dataclass
class Sweep:
    plan: Plan
    runs: dict[int, dict[int, Run]] = field(default_factory=dict)  # k -> concurrency -> run
    current: int = 0  # the k the server runs, as the daemon last said
    steps: list[str] = field(default_factory=list)  # the daemon's details


async def run_sweep(
    sweep: Sweep,
    api: DaemonApi,
    options: Options,
    hold: Hold,
    progress: TuneProgress,
    phase_seconds: float,
) -> None:
    """Measure every k of the plan; each run lands in ``sweep.runs`` as it is done. Raises
    TuneError (the server unreachable, a step that failed, k not the one asked for)."""
    for k in sweep.plan.order:
        if k != sweep.current:
            await hold.renew(phase_seconds)
            progress.say(f"k {sweep.current} -> {k}: the daemon restarts vLLM and verifies it")
            started = time.monotonic()
            try:
                sweep.steps.append(await api.step(sweep.plan.action, k))
            except DaemonError as exc:
                sweep.current = await _where(api, sweep)
                raise TuneError(str(exc)) from None
            sweep.current = k
            progress.restarted(time.monotonic() - started)
        for concurrency in sweep.plan.concurrency:
            await hold.renew(phase_seconds)
            progress.say(f"measuring k={k} at concurrency {concurrency}")
            started = time.monotonic()
            try:
                made = await measure(options, k, concurrency, None)
            except BenchError as exc:
                raise TuneError(f"k={k}: {exc}") from None
            if made.failed:
                kinds = sorted(
                    {kind for p in made.report["phases"].values() for kind in p["summary"]["errors"]}
                )
                raise TuneError(
                    f"k={k}: {made.failed} request(s) failed ({', '.join(kinds)}): is the server still up?"
                )
            if made.draft_positions != k:
                raise TuneError(
                    f"k={k}: the server's /metrics counts {made.draft_positions} draft positions, not {k}: "
                    "is --url the server the vllm_restart action restarts?"
                )
            sweep.runs.setdefault(k, {})[concurrency] = made
            progress.measured(time.monotonic() - started)


async def _where(api: DaemonApi, sweep: Sweep) -> int:
    """The k the daemon says the server runs after a failed step (it rolled back, or not)."""
    try:
        return (await api.ladder(sweep.plan.action)).k
    except DaemonError:
        return sweep.current


async def restore(sweep: Sweep, api: DaemonApi, progress: TuneProgress) -> str | None:
    """Put the original k back (nothing to do when the server runs it). Returns a line saying what
    went wrong, or None."""
    try:
        sweep.current = (await api.ladder(sweep.plan.action)).k
    except DaemonError as exc:
        return f"could not ask the daemon which k runs: {exc}; check `specguard ladder show`"
    if sweep.current == sweep.plan.original:
        return None
    progress.say(f"k {sweep.current} -> {sweep.plan.original}: restoring the original k")
    try:
        sweep.steps.append(await api.step(sweep.plan.action, sweep.plan.original))
    except DaemonError as exc:
        return f"could not restore k={sweep.plan.original}: {exc}; check `specguard ladder show`"
    sweep.current = sweep.plan.original
    return None


async def release(hold: Hold, settle: float) -> str | None:
    """Replace the sweep's silences by ones that last ``settle`` (none when 0)."""
    try:
        if settle > 0:
            await hold.renew(settle)
        else:
            for silence_id in hold.ids:
                await hold.api.expire(silence_id)
            hold.ids = []
    except DaemonError as exc:
        return f"the sweep's silences were not renewed for the settling time: {exc}"
    return None
