"""Item 5: speculation pays, by more than ``preflight.min_speedup`` (the playbook's 1.3x). Measured
when the baseline holds a ``specguard bench --against`` run for the model (the plain server's median
TPOT over the speculative one's); otherwise estimated from production traffic, MAL / (1 + k c), with
the mean acceptance length and k from the daemon's history over ``preflight.acceptance_period`` and
c from the baseline (its ``speculative`` entry). The answer says which."""

from __future__ import annotations

from specguard.metrics.figures import drafted_per_step, figures, total
from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.items.acceptance import coverage
from specguard.preflight.servers import servers
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
    for server in await servers(ctx):
        if server.model is not None and server.k != 0:
            series[(server.instance, server.model)] = server.base_url
    if isinstance(window, Window):
        for key, spans in window.spans.items():
            if total(spans)[0].get("drafts"):
                series.setdefault(key, key[0])
    if not series:
        why = (
            window.why
            if isinstance(window, Unread)
            else "no running speculative server, and no drafts in history"
        )
        return Answer(Status.UNKNOWN, (why,))
    evidence: list[str] = []
    verdicts: list[Status] = []
    fix = None
    for (instance, model), url in sorted(series.items()):
        line, verdict, measure = _judge(instance, model, baseline, window, settings.min_speedup)
        evidence.append(f"{instance} {model}: {line}")
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


def _judge(instance: str, model: str, baseline: Baseline | None, window: Window | Unread,
           least: float) -> tuple[str, Status, bool]:  # fmt: skip
    """What was found, the verdict, and whether a measurement (bench --against) is what it lacks."""
    labels = {"instance": instance, "model_name": model}
    entry = baseline.entry_for(labels) if baseline is not None else None
    if entry is not None and not isinstance(entry, str) and entry.without_speculation is not None:
        measured = entry.without_speculation.speedup.get("tpot")
        if measured is not None:
            verdict = Status.PASS if measured > least else Status.FAIL
            when = f", measured {entry.measured_at:%Y-%m-%d}" if entry.measured_at else ""
            return (f"{measured:.2f}x {'over' if verdict is Status.PASS else 'NOT over'} {least:g}x, measured "
                    f"by specguard bench --against (median TPOT, plain / speculative{when})", verdict, False)  # fmt: skip
    if isinstance(window, Unread):
        return (
            f"no bench --against figure in the baseline, and no history to estimate from: {window.why}",
            Status.UNKNOWN,
            True,
        )
    parts, minutes = total(window.spans.get((instance, model), []))
    mal = figures(parts, minutes)["mean_acceptance_length"]
    k = drafted_per_step(parts)
    if mal is None or k is None:
        return (f"no bench --against figure in the baseline, and no draft in the last "
                f"{period(window.end - window.start)} of history to estimate from", Status.FAIL, True)  # fmt: skip
    if baseline is None:
        return "no baseline: no draft cost c to estimate with", Status.FAIL, True
    cost = baseline.draft_cost(labels)
    if isinstance(cost, str):
        return f"no draft cost c to estimate with: {cost}", Status.FAIL, True
    estimate = mal / (1 + k * cost)
    verdict = Status.PASS if estimate > least else Status.FAIL
    return (f"{estimate:.2f}x {'over' if verdict is Status.PASS else 'NOT over'} {least:g}x, estimated "
            f"MAL / (1 + k c) = {mal:.2f} / (1 + {k:g} x {cost:g}) from production traffic "
            f"({coverage(window, minutes)}; no bench --against figure in the baseline)", verdict, False)  # fmt: skip
