"""Item 4: acceptance over ``preflight.min_acceptance`` (the playbook's 0.55) on production traffic:
each server's acceptance rate (accepted / drafted tokens) over the last ``preflight.acceptance_period``
of the daemon's history, with the mean acceptance length beside it."""

from __future__ import annotations

from specguard.metrics.figures import figures, total
from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.window import Unread, Window, period, read

NUMBER = 4
KEY = "acceptance"
TITLE = "acceptance on production traffic"


def run_daemon(ctx: Context) -> str:
    config = f" --config {ctx.config_file}" if ctx.config_file else ""
    return (
        f"specguard run{config}   # on production traffic, until history covers preflight.acceptance_period"
    )


def coverage(window: Window, minutes: int) -> str:
    return f"{minutes} min of history in the last {period(window.end - window.start)}"


async def check(ctx: Context) -> Answer:
    settings = ctx.loaded.config.preflight
    window = await read(ctx, settings.acceptance_period)
    if isinstance(window, Unread):
        return Answer(Status.UNKNOWN, (window.why,))
    evidence: list[str] = []
    low = False
    for (instance, model), spans in sorted(window.spans.items()):
        parts, minutes = total(spans)
        found = figures(parts, minutes)
        rate, drafts = found["acceptance_rate"], parts.get("drafts", 0.0)
        if rate is None or not drafts:
            continue
        mal = found["mean_acceptance_length"]
        verdict = "over" if rate > settings.min_acceptance else "NOT over"
        low = low or rate <= settings.min_acceptance
        evidence.append(
            f"{instance} {model}: acceptance {rate:.3f} {verdict} {settings.min_acceptance:g} "
            f"(mean acceptance length {mal:.2f}; {drafts:,.0f} drafts, {coverage(window, minutes)})"
        )
    if not evidence:
        return Answer(Status.FAIL, (f"no draft recorded in the last {period(settings.acceptance_period)} of "
                                    "history: no production traffic to judge",), run_daemon(ctx))  # fmt: skip
    if low:
        return Answer(Status.FAIL, tuple(evidence),
                      "specguard diagnose --since " + period(settings.acceptance_period)
                      + "   # why (draft, traffic classes, temperature); then change the draft or route the class away")  # fmt: skip
    return Answer(Status.PASS, tuple(evidence))
