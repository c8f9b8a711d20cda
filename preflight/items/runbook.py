"""Item 11: the runbook reaches on-call. Every enabled rule that acts beyond logging (a Slack
notice, a fallback, a restart) carries a ``runbook_url`` annotation, and the link resolves
(``preflight.links``). With ``--notify-test``, a test message goes through the configured ``slack``
action's token and channel and is deleted at once (``actions.slack.probe``).

No rule acting beyond ``log`` fails: then nothing reaches on-call. A link built from what only a
firing knows (``{labels[instance]}``, ``{value}``) cannot be followed before one: unknown."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from specguard.config.loading import LoadedRule
from specguard.preflight.item import Answer, Context, Status

NUMBER = 11
KEY = "runbook"
TITLE = "runbook reaches on-call"

ANNOTATION = "runbook_url"
# The template fields a link may use and still be followed now: the rule's own, the same at every firing.
STATIC = ("rule", "signal", "severity", "condition", "for", "consecutive")
TEXT = "specguard preflight on {host}: a test that this channel reaches on-call (deleted at once)."


def acting(ctx: Context) -> list[LoadedRule]:
    """The enabled rules (not shadow) that name an action other than a ``log`` one."""
    actions = ctx.loaded.actions

    def acts(name: str) -> bool:
        action = actions.get(name)
        return action is None or action.type != "log"  # an action not built: what it does is unknown

    return [
        r for r in ctx.loaded.enabled_rules() if not r.rule.shadow and any(acts(a) for a in r.rule.actions)
    ]


def _link(rule: LoadedRule) -> str | None:
    """The rule's runbook link as it will be sent, or None when it depends on a firing."""
    from specguard.rules.messages import fields
    from specguard.rules.templates import fields_of, render, root_of

    template = rule.rule.annotations[ANNOTATION]
    if any(root_of(f) not in STATIC for f in fields_of(template)):
        return None
    known = {k: v for k, v in fields(rule.rule, "firing", "pending", None, {}).items() if k in STATIC}
    return render(template, labels={}, value=None, **known)


async def _links(rules: list[LoadedRule]) -> tuple[list[str], Status]:
    from specguard.preflight.links import resolve, session

    lines: list[str] = []
    worst = Status.PASS
    checks = []
    for rule in rules:
        if ANNOTATION not in rule.rule.annotations:
            lines.append(f"{rule.name} ({', '.join(rule.rule.actions)}): no {ANNOTATION} annotation")
            worst = Status.FAIL
            continue
        link = _link(rule)
        if link is None:
            lines.append(f"{rule.name}: {ANNOTATION} depends on the firing: "
                         f"{rule.rule.annotations[ANNOTATION]!r} cannot be followed now")  # fmt: skip
            worst = Status.FAIL if worst is Status.FAIL else Status.UNKNOWN
            continue
        base = None if rule.file.startswith("builtin:") else Path(rule.file).parent
        checks.append((rule, link, base))
    unique = list(dict.fromkeys((link, base) for _, link, base in checks))  # each link followed once
    async with session() as http:
        answers = dict(zip(unique, await asyncio.gather(*(resolve(*u, http) for u in unique)), strict=True))
    for rule, link, base in checks:
        resolved = answers[(link, base)]
        lines.append(f"{rule.name}: {resolved.detail}")
        if resolved.status is Status.FAIL:
            worst = Status.FAIL
        elif resolved.status is Status.UNKNOWN and worst is Status.PASS:
            worst = Status.UNKNOWN
    return lines, worst


def _slack_action(ctx: Context) -> tuple[str | None, str]:
    """The slack action --notify-test posts through (its name), or None and why."""
    from specguard.actions.slack import SlackAction

    wanted = ctx.loaded.config.preflight.slack
    found = sorted(n for n, a in ctx.loaded.actions.items() if isinstance(a, SlackAction))
    if wanted is not None:
        if wanted in found:
            return wanted, ""
        return (
            None,
            f"preflight.slack names {wanted!r}, which is not a slack action ({', '.join(found) or 'none'})",
        )
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, "the config has no slack action: nothing posts to on-call's channel"
    return None, f"several slack actions ({', '.join(found)}): name the one on-call reads in preflight.slack"


async def _notify(ctx: Context) -> tuple[str, str | None]:
    """--notify-test: the evidence line, and the fix when it did not work (None: it did)."""
    from specguard.actions.slack import Failed, Retry, SlackAction
    from specguard.actions.slack.probe import NotDeleted

    name, why = _slack_action(ctx)
    if name is None:
        return f"--notify-test: {why}", "add a slack action for on-call's channel (docs/slack.md)"
    action = ctx.loaded.actions[name]
    assert isinstance(action, SlackAction)
    try:
        probe = await action.post_test(TEXT.format(host=socket.gethostname()))
    except NotDeleted as exc:
        return (
            f"--notify-test through actions.{name}: {exc}: delete it by hand",
            "let the bot delete its own messages (its token's chat:write scope), then delete the test message",
        )
    except (Retry, Failed) as exc:
        return (
            f"--notify-test through actions.{name}: not posted: {exc}",
            f"correct actions.{name}'s token and channel (docs/slack.md), then "
            "`specguard preflight --only runbook --notify-test`",
        )
    if not probe.deleted:
        return f"--notify-test through actions.{name}: posted through its incoming webhook (it stays)", None
    return f"--notify-test through actions.{name}: posted to {probe.channel} as {probe.ts}, and deleted", None


async def check(ctx: Context) -> Answer:
    rules = acting(ctx)
    if not rules:
        return Answer(
            Status.FAIL,
            ("no enabled rule acts beyond `log`: nothing reaches on-call",),
            "give the rules that matter a slack action (docs/slack.md) and a runbook_url annotation",
        )
    lines, status = await _links(rules)
    evidence = [f"{len(rules)} rule(s) act beyond logging", *lines]
    fixes = []
    if status is Status.FAIL:
        fixes.append(f"give each of these rules an annotation {ANNOTATION}: a page that opens (HTTP 2xx/3xx, "
                     "or a file with the anchor), then `systemctl reload specguard`")  # fmt: skip
    elif status is Status.UNKNOWN:
        fixes.append(f"write {ANNOTATION} without what only a firing knows ({{labels[...]}}, {{value}}), "
                     "or follow the links listed by hand")  # fmt: skip
    if ctx.notify_test:
        said, fix = await _notify(ctx)
        evidence.append(said)
        if fix is not None:
            status = Status.FAIL
            fixes.append(fix)
    else:
        name, why = _slack_action(ctx)
        evidence.append(
            f"Slack not tested: --notify-test posts a test message through actions.{name} and deletes it"
            if name is not None
            else f"Slack: {why}"
        )
    return Answer(status, tuple(evidence), "; ".join(fixes) or None)
