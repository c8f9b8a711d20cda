"""Item 7: the fallback is built (a ``feature_flag`` action that a rule names, with a canary) and
drilled: with ``--drill``, the drill (``preflight.drill``: engage, traffic seen moving, the canary,
restore, recorded); without, the last drill's outcome and age against ``preflight.drill.max_age``."""

from __future__ import annotations

import time
from pathlib import Path

from specguard.actions.feature_flag import FeatureFlagAction
from specguard.config.loading import Loaded
from specguard.preflight.drill import claim
from specguard.preflight.drill.run import budget, run_drill
from specguard.preflight.item import Answer, Context, Status
from specguard.rules.durations import format_duration
from specguard.store import drills
from specguard.store.database import StoreError, opened

NUMBER = 7
KEY = "drill"
TITLE = "fallback built and drilled"
READ_TIMEOUT = 30.0


def pick(loaded: Loaded) -> FeatureFlagAction | str:
    """The action to drill: ``preflight.drill.action``, or the config's only ``feature_flag``; why not."""
    name = loaded.config.preflight.drill.action
    flags = sorted(n for n, a in loaded.actions.items() if isinstance(a, FeatureFlagAction))
    if name is not None:
        found = loaded.actions.get(name)
        if isinstance(found, FeatureFlagAction):
            return found
        if found is None:
            return f"preflight.drill.action: no action named {name!r} (feature_flag actions: {', '.join(flags) or 'none'})"
        return f"preflight.drill.action: {name!r} is a {found.type} action, not a feature_flag"
    if not flags:
        return "no feature_flag action is configured: there is no fallback to drill"
    if len(flags) > 1:
        return f"several feature_flag actions ({', '.join(flags)}): name the one to drill in preflight.drill.action"
    found = loaded.actions[flags[0]]
    assert isinstance(found, FeatureFlagAction)
    return found


def _command(ctx: Context) -> str:
    config = f" --config {ctx.config_file}" if ctx.config_file is not None else ""
    return f"specguard preflight --drill --only drill{config}"


def built(loaded: Loaded, action: FeatureFlagAction) -> tuple[list[str], str | None]:
    """What the fallback lacks to be built (a rule that engages it, a canary that checks a
    restore), and the change that builds it."""
    lacking, fixes = [], []
    rules = [
        r.name for r in loaded.rules if r.rule.enabled and not r.rule.shadow and action.name in r.rule.actions
    ]
    if not rules:
        lacking.append(
            f"no enabled rule names {action.name} in its actions: nothing would engage the fallback"
        )
        fixes.append(
            f"add {action.name} to the actions of the rule that should fall back (see docs/actions.md)"
        )
    if action.canary is None:
        lacking.append(
            f"actions.{action.name} has no canary: a restore would send traffic back to a speculative "
            "server nobody checked"
        )
        fixes.append(f"give actions.{action.name} a canary (see docs/actions.md)")
    return lacking, "; ".join(fixes) or None


def timeout(ctx: Context) -> float:
    """How long the item may take: a whole drill with ``--drill``, else a read of the store."""
    action = pick(ctx.loaded)
    if not ctx.drill or isinstance(action, str):
        return READ_TIMEOUT
    return budget(ctx.loaded, action)


async def check(ctx: Context) -> Answer:
    action = pick(ctx.loaded)
    if isinstance(action, str):
        fix = (
            "name the feature_flag action to drill in preflight.drill.action"
            if "preflight.drill.action" in action
            else "configure a feature_flag action and name it in a rule's actions (see docs/actions.md)"
        )
        return Answer(Status.FAIL, (action,), fix)
    lacking, fix_built = built(ctx.loaded, action)
    if ctx.drill:
        try:
            result = await run_drill(ctx.loaded, action, ctx.loaded.config.store_file())
        except StoreError as exc:  # the drill cannot be recorded: none is made (or it is restored)
            return Answer(Status.FAIL, (f"the drill cannot be recorded: {exc}", *lacking), str(exc))
        evidence = (f"{result.outcome}: {result.detail}", *result.evidence, *lacking)
        if result.outcome == drills.PASSED and not lacking:
            return Answer(Status.PASS, evidence)
        then = f"see the drill's evidence, then {_command(ctx)}"
        return Answer(Status.FAIL, evidence, fix_built if result.outcome == drills.PASSED else then)
    return await _last(ctx, action, lacking, fix_built)


async def _last(ctx: Context, action: FeatureFlagAction, lacking: list[str], fix_built: str | None) -> Answer:
    """Without --drill: the newest drill that says whether the fallback works, and its age."""
    command = _command(ctx)
    path: Path | None = ctx.store_file
    if path is None or not path.is_file():
        return Answer(Status.FAIL, ("no drill on record: there is no state database yet", *lacking), command)
    try:
        async with opened(path) as store:
            left = await claim.left_by_drill(claim.DrillMemory(store, action.name))
            found = await store.call(
                lambda db: drills.latest(db, 1, action=action.name, outcomes=drills.TELLING)
            )
    except StoreError as exc:
        return Answer(Status.UNKNOWN, (str(exc),), command)
    if left is not None and not left.running:
        return Answer(
            Status.FAIL,
            (
                f"drill #{left.drill} did not restore the flag (its record says {left.state}): it may "
                "still be engaged",
                *lacking,
            ),
            f"{command} (restores it first)",
        )
    if not found:
        return Answer(Status.FAIL, (f"no drill of {action.name} on record", *lacking), command)
    last = found[0]
    at = last.finished if last.finished is not None else last.started
    age = max(0.0, ctx.now - at)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    said = f"the last drill (#{last.id}, {when}, {format_duration(round(age))} ago) {last.outcome}: {last.detail}"
    if last.outcome != drills.PASSED:
        return Answer(Status.FAIL, (said, *lacking), f"fix what it found, then {command}")
    max_age = ctx.loaded.config.preflight.drill.max_age
    if age > max_age:
        return Answer(
            Status.FAIL,
            (f"{said}; older than preflight.drill.max_age {format_duration(max_age)}", *lacking),
            command,
        )
    if lacking:
        return Answer(Status.FAIL, (said, *lacking), fix_built)
    return Answer(Status.PASS, (said,))
