"""Item 5: speculation pays, by more than ``preflight.min_speedup`` (the playbook's 1.3x). Measured
when the baseline holds a ``specguard bench --against`` run for the model (the plain server's median
TPOT over the speculative one's); estimated from production traffic, MAL / (1 + k c), with the mean
acceptance length and k from the daemon's history over ``preflight.acceptance_period`` and c from the
baseline (its ``speculative`` entry). Each figure says which it is. With both, both must be over:
the bench's prompts are not production's, and traffic whose acceptance is lower does not get the
speedup the bench measured."""

from __future__ import annotations

from specguard.metrics.figures import drafted_per_step, figures, total
from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.items.acceptance import coverage
from specguard.preflight.servers import describe, down_fix, servers
from specguard.preflight.window import Unread, Window, period, read
from specguard.store.baseline import Baseline

NUMBER = 5
KEY = "speedup"
TITLE = "speculation pays"


def measure_command(ctx: Context, url: str) -> str:
    path = ctx.loaded.config.baseline or "baseline.json"
    return f"specguard bench --url {url} --against PLAIN_URL --write-baseline {path}"


async def check(ctx: Context) -> Answer:
    settings = ctx.loaded.config.preflight
    baseline = ctx.loaded.baseline
    window = await read(ctx, settings.acceptance_period)
    series: dict[tuple[str, str], str] = {}  # (instance, model) -> the server's URL
    configured = await servers(ctx)
    for server in configured:
        if server.model is not None and server.k != 0:
            series[(server.instance, server.model)] = server.base_url
    if isinstance(window, Window):
        for key, spans in window.spans.items():
            if total(spans)[0].get("drafts"):
                series.setdefault(key, key[0])
    if not series:
        if isinstance(window, Unread):
            return Answer(Status.UNKNOWN, (window.why,))
        down = [s for s in configured if s.k is None]
        said = (f"no configured server runs speculative decoding, and history holds no draft in the last "
                f"{period(settings.acceptance_period)}")  # fmt: skip
        deploy = down_fix(down[0]) if down else "deploy the serving file (`specguard serve-config`)"
        return Answer(Status.FAIL, (*map(describe, configured), said), deploy)
    evidence: list[str] = []
    verdicts: list[Status] = []
    fix: str | None = None
    for (instance, model), url in sorted(series.items()):
        lines, verdict, measure = _judge(instance, model, baseline, window, settings.min_speedup)
        evidence += [f"{instance} {model}: {lines[0]}", *(f"  {line}" for line in lines[1:])]
        verdicts.append(verdict)
        if verdict is not Status.PASS and fix is None:
            fix = measure_command(ctx, url) if measure else (
                "lower k (`specguard tune`), choose a cheaper draft, or fall back to standard decoding"
            )  # fmt: skip
    status = (
        Status.FAIL
        if Status.FAIL in verdicts
        else Status.UNKNOWN
        if Status.UNKNOWN in verdicts
        else Status.PASS
    )
    return Answer(status, tuple(evidence), fix if status is not Status.PASS else None)


def _over(value: float, least: float) -> str:
    return f"{value:.2f}x {'over' if value > least else 'NOT over'} {least:g}x"


def _judge(instance: str, model: str, baseline: Baseline | None, window: Window | Unread,
           least: float) -> tuple[list[str], Status, bool]:  # fmt: skip
    """What was found (lines), the verdict, and whether a measurement (bench --against) is what it
    lacks. With both figures, both must be over: the bench's prompts are not production's."""
    labels = {"instance": instance, "model_name": model}
    entry = baseline.entry_for(labels) if baseline is not None else None
    entry = None if isinstance(entry, str) else entry
    measured = entry.without_speculation.speedup.get("tpot") if entry and entry.without_speculation else None
    estimate, said = _estimate(labels, baseline, window)
    lines, figures_ = [], []
    if measured is not None:
        when = f", measured {entry.measured_at:%Y-%m-%d}" if entry and entry.measured_at else ""
        lines.append(f"{_over(measured, least)}, measured by specguard bench --against (median TPOT, plain / "
                     f"speculative{when})")  # fmt: skip
        figures_.append(measured)
    if estimate is not None:
        lines.append(f"{_over(estimate, least)}, {said}")
        figures_.append(estimate)
    elif measured is not None:
        lines.append(f"not estimated from production traffic: {said}")
    if figures_:
        return lines, Status.PASS if min(figures_) > least else Status.FAIL, False
    unread = isinstance(window, Unread)
    return (
        [f"no bench --against figure in the baseline, and {said}"],
        Status.UNKNOWN if unread else Status.FAIL,
        True,
    )


def _estimate(
    labels: dict[str, str], baseline: Baseline | None, window: Window | Unread
) -> tuple[float | None, str]:
    """MAL / (1 + k c) from production traffic, and what it was made of; or None and why not."""
    if isinstance(window, Unread):
        return None, f"no history to estimate from: {window.why}"
    parts, minutes = total(window.spans.get((labels["instance"], labels["model_name"]), []))
    mal = figures(parts, minutes)["mean_acceptance_length"]
    k = drafted_per_step(parts)
    if mal is None or k is None:
        return None, f"no draft in the last {period(window.end - window.start)} of history to estimate from"
    if baseline is None:
        return None, "no baseline: no draft cost c to estimate with"
    cost = baseline.draft_cost(labels)
    if isinstance(cost, str):
        return None, f"no draft cost c to estimate with: {cost}"
    return mal / (1 + k * cost), (f"estimated MAL / (1 + k c) = {mal:.2f} / (1 + {k:g} x {cost:g}) from "
                                  f"production traffic ({coverage(window, minutes)})")  # fmt: skip
