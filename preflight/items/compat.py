"""Item 2: ``specguard compat`` passes for the serving file's target and draft (``serving:`` in the
config): no check incompatible. Warnings (vLLM runs the pair, acceptance may suffer somewhere) pass,
each listed. Needs transformers (the ``playbook`` extra) and both models on this host; without
either, the host cannot tell (unknown)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from specguard.playbook.serve_config.serving import ServingError, load_serving
from specguard.playbook.serve_config.versions import NO_DRAFT
from specguard.preflight.item import Answer, Context, Status

NUMBER = 2
KEY = "compat"
TITLE = "compat passes for the target and draft"


async def check(ctx: Context) -> Answer:
    path = ctx.loaded.config.serving
    if path is None:
        return Answer(Status.UNKNOWN, ("the config names no serving file (`serving:`): which target and draft "
                                       "run is not known here",),
                      "set `serving: serving.yaml` in the config (see docs/serve-config.md)")  # fmt: skip
    try:
        serving = load_serving(path)
    except ServingError as exc:
        return Answer(
            Status.FAIL, tuple(str(exc).splitlines()), f"correct it, then `specguard serve-config {path}`"
        )
    said = f"serving file {path}: target {serving.target}, method {serving.method}"
    if serving.draft is None:
        assert serving.method in NO_DRAFT  # load_serving refuses a method that needs a draft without one
        return Answer(Status.PASS, (f"{said}: no draft model, nothing to compare",))
    said += f", draft {serving.draft}"
    return await asyncio.to_thread(_compare, serving.target, serving.draft, serving.method, said, path)


def _compare(target: str, draft: str, method: str, said: str, path: Path) -> Answer:
    from specguard.playbook.compat import loading, run, samples
    from specguard.playbook.compat.method import METHODS
    from specguard.playbook.compat.verdicts import Verdict

    command = f"specguard compat {target} {draft}"
    try:
        report = run.compare(target, draft, samples.builtin_samples(), method if method in METHODS else None)
    except loading.MissingExtra as exc:
        return Answer(Status.UNKNOWN, (said, str(exc)), "pip install 'specguard[playbook]'")
    except loading.InputError as exc:
        if Path(target).is_dir() and Path(draft).is_dir():  # both here, one of them not a usable model
            return Answer(Status.FAIL, (said, str(exc)), command)
        # a model that is not on this host (vLLM may fetch it at start-up): nothing to read here
        return Answer(Status.UNKNOWN, (said, f"cannot compare on this host: {exc}"), command)
    counts = report.counts()
    evidence = [said, f"compat ({report.method}): " + ", ".join(f"{n} {v}" for v, n in counts.items())]
    for item in report.checks:
        if item.verdict is not Verdict.OK:
            evidence.append(f"{item.verdict.value}: {item.area} / {item.name}: {item.evidence}")
    if report.verdict is Verdict.INCOMPATIBLE:
        return Answer(Status.FAIL, tuple(evidence), f"{command}  # then set a draft that fits in {path}")
    return Answer(Status.PASS, tuple(evidence))
