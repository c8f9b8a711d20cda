"""``specguard tune`` from start to end: the daemon and its ladder checked, the serving file
checked, the plan said up front, the plain reference (``--against``) measured, the sweep run with
SIGINT and SIGTERM cancelling it, the original k put back whatever happened, then the table, the
recommendation and, with ``--write``, the files."""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from specguard.playbook.bench.runner import BenchError, Options
from specguard.playbook.tune import record, write
from specguard.playbook.tune.daemon import DaemonApi, DaemonError, Ladder
from specguard.playbook.tune.measure import Run, draft_cost, measure
from specguard.playbook.tune.predict import predict
from specguard.playbook.tune.progress import TuneProgress
from specguard.playbook.tune.sweep import Hold, Sweep, TuneError, plan, release, restore, run_sweep
from specguard.playbook.tune.table import render
from specguard.playbook.tune.verdict import Verdict, decide


@dataclass(frozen=True)
class TuneOptions:
    bench: Options  # the server's URL, prompts and load, as bench takes them
    sweep: tuple[int, ...]
    concurrency: tuple[int, ...]
    action: str | None = None
    against: str | None = None  # a plain server: the reference, instead of rung 0
    draft_cost: float | None = None
    baseline_cost: tuple[float, str] | None = None  # c from the baseline file, and what it says of it
    rules: tuple[str, ...] = ()  # the rules silenced during the sweep
    settle: float = 0.0
    phase_seconds: float = 1800.0  # a silence's length: the longest a step or a measurement may take
    restart_guess: float = 90.0
    serving: Path | None = None
    baseline: Path | None = None
    write: bool = False
    method: str | None = None
    store: Path | None = None  # the state database the result is recorded in (tune_results)


class Stopped(Exception):
    """SIGINT or SIGTERM: the sweep was cut short (the original k restored)."""


async def tune(options: TuneOptions, api: DaemonApi, out: TextIO, err: TextIO) -> int:
    try:
        ladder = await _ladder(options, api)
        if options.write and options.serving is not None:
            write.load(options.serving)  # a bad file stops here, before anything changes
        planned = plan(
            ladder, options.sweep, options.concurrency, options.against is None and 0 in ladder.rungs
        )
        if options.draft_cost is None and options.baseline_cost is None and 0 not in planned.order \
                and options.against is None:  # fmt: skip
            raise TuneError(
                "no draft cost to predict with: give --draft-cost, a --baseline whose entry has "
                "speculative.draft_cost (bench --against writes it), --against a plain server, or a ladder "
                "with rung 0 (measured as the reference)"
            )
    except (TuneError, DaemonError, write.ServingFileError) as exc:
        err.writelines(f"specguard tune: {line}\n" for line in str(exc).splitlines())
        return 2
    measurements = len(planned.order) * len(planned.concurrency) + (
        len(planned.concurrency) if options.against else 0
    )
    progress = TuneProgress(err, planned.restarts, measurements, options.restart_guess)
    progress.note(
        f"{planned.action}: k={planned.original} now; sweeping k {', '.join(map(str, planned.ks))} at concurrency "
        f"{', '.join(map(str, planned.concurrency))}"
        + (" and k=0 as the plain reference" if 0 in planned.order else "")
        + f": {planned.restarts} restart(s), each taking minutes on a real host; the original k is restored "
        "at the end, after a failure or on Ctrl-C"
    )
    reason = f"specguard tune: sweeping k {','.join(map(str, planned.ks))} on {planned.action}"
    hold = Hold(api, options.rules, reason)
    if options.rules:
        progress.note(f"silencing {', '.join(options.rules)} during the sweep (they name {planned.action})")
    sweep = Sweep(planned, current=planned.original)
    reference: dict[int, Run] = {}
    failure: str | None = None
    task = asyncio.ensure_future(_measure_all(options, sweep, api, hold, progress, reference))
    stopped = _on_signals(task, progress, planned.original)
    try:
        try:
            await task
        except asyncio.CancelledError:
            failure = "stopped"
        except (TuneError, DaemonError) as exc:
            failure = str(exc)
        except Exception as exc:  # whatever it was, the original k goes back first
            failure = f"{type(exc).__name__}: {exc}"
        trouble = await restore(sweep, api, progress)
        settle = await release(hold, options.settle) if options.rules else None
    finally:
        _signals_off()
    for line in (trouble, settle):
        if line is not None:
            err.write(f"specguard tune: {line}\n")
    if failure is not None:
        if stopped():
            err.write(f"specguard tune: stopped; k={sweep.current} runs (the original: {planned.original})\n")
            return 130
        err.write(f"specguard tune: {failure}; k={sweep.current} runs (the original: {planned.original})\n")
        return 2
    verdict = _verdict(options, sweep, reference, err)
    render(verdict, out)
    await _record(options, verdict, planned.original, err)
    if trouble is not None:
        return 2
    if verdict.recommended != planned.original:
        err.write(
            f"specguard tune: the server runs k={planned.original} again; to run k={verdict.recommended}: "
            f"`specguard ladder set {verdict.recommended}`, or deploy the serving file\n"
        )
    if options.write:
        return _write(options, verdict, err)
    if options.serving is not None or options.baseline is not None:
        err.write("specguard tune: nothing written (give --write to update the serving and baseline files)\n")
    return 0


async def _ladder(options: TuneOptions, api: DaemonApi) -> Ladder:
    found = await api.ladders()
    if not found:
        raise TuneError(
            "the daemon has no vllm_restart action: tune steps k through one (see docs/vllm-restart.md)"
        )
    if options.action is not None:
        named = [ladder for ladder in found if ladder.action == options.action]
        if not named:
            known = ", ".join(ladder.action for ladder in found)
            raise TuneError(
                f"--action: the daemon has no vllm_restart action {options.action!r} (it has {known})"
            )
        found = named
    if len(found) > 1:
        raise TuneError(
            f"several vllm_restart actions ({', '.join(item.action for item in found)}): give --action"
        )
    ladder = found[0]
    if ladder.change is not None:
        raise TuneError(f"{ladder.action}: a change of k is under way; run tune once it is over")
    return ladder


async def _measure_all(
    options: TuneOptions,
    sweep: Sweep,
    api: DaemonApi,
    hold: Hold,
    progress: TuneProgress,
    reference: dict[int, Run],
) -> None:
    if options.against is not None:
        plain = replace(options.bench, url=options.against)
        for concurrency in options.concurrency:
            progress.say(f"measuring the plain reference {options.against} at concurrency {concurrency}")
            started = time.monotonic()
            try:
                reference[concurrency] = await measure(plain, 0, concurrency, None)
            except BenchError as exc:
                raise TuneError(f"--against: {exc}") from None
            progress.measured(time.monotonic() - started)
    await run_sweep(sweep, api, options.bench, hold, progress, options.phase_seconds)
    if 0 in sweep.runs:
        reference.update(sweep.runs.pop(0))


def _on_signals(task: asyncio.Future[None], progress: TuneProgress, original: int) -> _Flag:
    """SIGINT and SIGTERM cancel the sweep; once it is over (restoring), they only say so."""
    flag = _Flag()
    loop = asyncio.get_running_loop()

    def stop(name: str) -> None:
        if flag.value or task.done():
            progress.note(f"{name}: restoring k={original}; it ends when the daemon's step does")
            return
        flag.value = True
        progress.note(f"{name}: stopping the sweep; restoring k={original}")
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig.name)
    return flag


def _signals_off() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


class _Flag:
    value = False

    def __call__(self) -> bool:
        return self.value


def _verdict(options: TuneOptions, sweep: Sweep, reference: dict[int, Run], err: TextIO) -> Verdict:
    largest = sweep.runs[max(sweep.plan.ks)][sweep.plan.concurrency[0]]
    costs: dict[str, float] = {}
    source = ""
    if options.draft_cost is not None:
        costs, source = {"*": options.draft_cost}, "--draft-cost"
    elif sweep.plan.concurrency[0] in reference:
        # none for a class whose streams came in bursts: their chunk gaps do not time steps; the
        # others' median stands for it (c is the draft's and the hardware's, not the traffic's)
        costs = draft_cost(largest, reference[sweep.plan.concurrency[0]])
        if costs:
            costs["*"] = statistics.median(costs.values())
        source = f"measured: chunk gaps at k={largest.k} over the plain run's, as bench --against finds it"
    if not costs and options.baseline_cost is not None:
        costs, source = {"*": options.baseline_cost[0]}, options.baseline_cost[1]
    if not costs:
        why = (
            " (the streams arrived in bursts, so their chunk gaps do not time the steps: give --draft-cost)"
            if sweep.plan.concurrency[0] in reference
            and (largest.bursts() or reference[sweep.plan.concurrency[0]].bursts())
            else ""
        )
        err.write(f"specguard tune: no draft cost: the PREDICTED column is empty{why}\n")
    predictions = predict(largest, costs, source, sweep.plan.original)
    return decide(Verdict(sweep.plan.ks, sweep.plan.concurrency, sweep.runs, reference, predictions))


async def _record(options: TuneOptions, verdict: Verdict, original: int, err: TextIO) -> None:
    """The result in the state database, for ``specguard preflight``; a failure is said, not fatal."""
    from specguard.store.database import StoreError

    if options.store is None:
        return
    if not options.store.is_file():
        err.write(
            f"specguard tune: not recorded: no state database at {options.store} (the daemon's state_dir)\n"
        )
        return
    try:
        err.write(
            f"{await record.save(options.store, record.result(verdict, options.bench.url, original))}\n"
        )
    except StoreError as exc:
        err.write(f"specguard tune: not recorded: {exc}\n")


def _write(options: TuneOptions, verdict: Verdict, err: TextIO) -> int:
    from specguard.playbook.bench.baseline import BaselineWriteError, entry
    from specguard.playbook.bench.baseline import write as write_baseline

    table = verdict.schedule
    k = verdict.recommended if table is None else max(row[2] for row in table)
    code = 0
    if options.serving is not None:
        try:
            err.write(f"serving: {write.update(options.serving, k, table)}\n")
        except write.ServingFileError as exc:
            err.writelines(f"specguard tune: {line}\n" for line in str(exc).splitlines())
            code = 2
    if options.baseline is not None:
        run = verdict.runs[verdict.recommended][verdict.primary]
        measured_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            said = write_baseline(
                options.baseline, entry(run.report, options.method, measured_at), measured_at
            )
            err.write(f"baseline: {said} (measured at k={verdict.recommended})\n")
        except BaselineWriteError as exc:
            err.write(f"specguard tune: {exc}\n")
            code = 2
    return code
