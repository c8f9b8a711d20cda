"""Item 8: the routing rules are configured: the config's ``routing:`` section renders and the
nginx of this host accepts the rendered router (``nginx -t``, as ``specguard check`` runs it).

No ``routing:`` section fails: the checklist asks for routing rules, and without them the fallback
flag has no router to move traffic. A section the loader refused (a class naming an unknown pool)
fails with the loader's words. No nginx on this host: unknown, since only nginx can say."""

from __future__ import annotations

import asyncio
import re

from specguard.preflight.item import Answer, Context, Status

NUMBER = 8
KEY = "routing"
TITLE = "routing rules render and nginx -t passes"

RENDER = "specguard routing render --config CONFIG --out /etc/nginx/specguard"


def _fix(ctx: Context, what: str) -> str:
    config = str(ctx.config_file) if ctx.config_file is not None else "CONFIG"
    return f"{what}; then `specguard check --config {config}` and `{RENDER.replace('CONFIG', config)}`"


async def check(ctx: Context) -> Answer:
    from specguard.playbook.routing.nginx_test import nginx_test

    loaded = ctx.loaded
    if "routing" in loaded.invalid_keys:
        said = tuple(str(p) for p in loaded.errors if re.split(r"[.\[]", p.field)[0] == "routing")
        return Answer(
            Status.FAIL,
            ("the config's routing: section is refused:", *(said or ("(see `specguard check`)",))),
            _fix(ctx, "correct the routing: section"),
        )
    routing = loaded.config.routing
    if routing is None:
        return Answer(
            Status.FAIL,
            ("the config has no routing: section: no traffic classes, no router for the fallback flag",),
            _fix(ctx, "add a routing: section (docs/routing.md)"),
        )
    facts = (
        f"routing: {len(routing.classes)} class(es) over pools "
        f"{', '.join(f'{name} ({len(pool.servers)} server(s))' for name, pool in sorted(routing.pools.items()))}; "
        f"default {routing.default_pool}, fallback {routing.fallback_pool}",
    )
    label = str(ctx.config_file) if ctx.config_file is not None else "<defaults>"
    try:
        tested = await asyncio.to_thread(nginx_test, routing, label)
    except OSError as exc:  # the temporary directory the router is rendered into
        return Answer(Status.UNKNOWN, (*facts, f"the router could not be rendered to test it: {exc}"))
    if tested is None:
        return Answer(
            Status.UNKNOWN,
            (*facts, "nginx is not installed on this host: `nginx -t` not run"),
            "run preflight on the router's host, or install nginx with libnginx-mod-http-lua and lua-cjson",
        )
    if not tested.ok:
        return Answer(
            Status.FAIL,
            (*facts, f"nginx -t refuses the rendered router: {tested.detail}"),
            _fix(ctx, "correct the routing: section (or install the Lua module nginx lacks)"),
        )
    return Answer(Status.PASS, (*facts, f"rendered; nginx -t passed ({tested.detail})"))
