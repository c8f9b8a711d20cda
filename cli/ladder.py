"""``specguard ladder show|up|down|set K``: the rungs of the ``vllm_restart`` actions.

``show`` reads the state database and the config file vLLM reads (the daemon need not run). The
steps go through the running daemon's API, which makes the change (restart, verification,
rollback) and journals it; the command waits for the outcome, which can take minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from specguard.cli.shared.options import add_config, who
from specguard.cli.shared.restarts import (
    ActionChoice,
    daemon_url,
    one_action,
    restart_actions,
    step_wait,
)


def add_parser(sub: Any) -> None:
    ladder = sub.add_parser(
        "ladder",
        help="num_speculative_tokens of the vllm_restart actions: show, up, down, set K",
        description="Show the rungs of the vllm_restart actions (k now, the ladder, the file vLLM reads "
        "its speculative config from, the change under way, the changes made), or step by hand. "
        "A step is made by the running daemon, which restarts vLLM, verifies the new k and rolls back "
        "if it does not come up; the command waits for the outcome.",
    )
    verbs = ladder.add_subparsers(dest="verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="k, the ladder and the changes made")
    show.add_argument("--format", choices=["table", "json"], default="table", help="default table")
    show.add_argument(
        "--last", type=int, default=10, metavar="N", help="changes shown per ladder (default 10)"
    )
    show.add_argument("--state-dir", type=Path, metavar="DIR", help="where the state database lives")
    up = verbs.add_parser("up", help="one rung up: more speculative tokens")
    down = verbs.add_parser("down", help="one rung down: fewer speculative tokens")
    to = verbs.add_parser("set", help="to a given rung")
    to.add_argument("k", type=int, help="a rung of the ladder (0: speculative decoding off)")
    for verb in (show, up, down, to):
        add_config(verb)
        verb.add_argument(
            "--action", metavar="NAME", help="which vllm_restart action (when there are several)"
        )


def cmd_ladder(args: argparse.Namespace) -> int:
    from specguard.config.loading import load

    overrides = (
        {"state_dir": str(Path.cwd() / args.state_dir.expanduser())}
        if getattr(args, "state_dir", None)
        else {}
    )
    loaded = load(args.config, (), overrides)
    if not loaded.ok:
        for problem in loaded.errors:
            print(f"specguard ladder: {problem}", file=sys.stderr)
        return 1
    where = args.config or "the built-in defaults"
    try:
        found = restart_actions(loaded, args.action, where)
        if args.verb == "show":
            return _show(args, loaded, found)
        name, action = one_action(found, where)
    except ActionChoice as exc:
        print(f"specguard ladder: {exc}", file=sys.stderr)
        return 2 if exc.kind == "several" else 1
    to: str | int = args.k if args.verb == "set" else args.verb
    url = f"{daemon_url(loaded.config)}/api/ladder/{name}"
    headers = {"Authorization": f"Bearer {loaded.webhook_token}"} if loaded.webhook_token else {}
    wait = step_wait(action)
    print(f"asking the daemon at {url.rsplit('/api', 1)[0]} to step {name} {to} (this can take minutes)...",
          file=sys.stderr)  # fmt: skip
    try:
        status, body = asyncio.run(_post(url, {"to": to, "who": who()}, headers, wait))
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        print(f"specguard ladder: the daemon at {url.rsplit('/api', 1)[0]} does not answer ({type(exc).__name__}: "
              f"{exc}); steps are made by the running daemon", file=sys.stderr)  # fmt: skip
        return 1
    if status != 200:
        print(f"specguard ladder {args.verb}: {body.get('error', body)}", file=sys.stderr)
        return 1
    print(("ok: " if body["ok"] else "failed: ") + str(body["detail"]))
    return 0 if body["ok"] else 1


async def _post(url: str, body: dict[str, Any], headers: dict[str, str], wait: float) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=wait)) as session,
        session.post(url, json=body, headers=headers) as answer,
    ):
        try:
            return answer.status, await answer.json(content_type=None)
        except ValueError:
            return answer.status, {"error": (await answer.text())[:300]}


def _show(args: argparse.Namespace, loaded: Any, found: dict[str, Any]) -> int:
    from specguard.store.database import StoreError, opened
    from specguard.store.memory import StoreMemory

    path = loaded.config.store_file()

    async def read() -> list[dict[str, Any]]:
        async with opened(path) as store:
            return [await action.show(StoreMemory(store, name)) for name, action in found.items()]

    try:
        shown = asyncio.run(read())
    except StoreError as exc:
        print(f"specguard ladder: {exc}", file=sys.stderr)
        return 1
    for item in shown:
        item["log"] = item["log"][-max(0, args.last) :]
    if args.format == "json":
        print(json.dumps(shown, indent=2))
        return 0
    for item in shown:
        rungs = " ".join(f"[{k}]" if k == item["k"] else str(k) for k in item["ladder"])
        print(f"{item['action']}: k={item['k']}  ladder {rungs}  ({item['file']} says k={item['file_k']})")
        change = item["change"]
        if change is not None:
            print(
                f"  under way: k {change['from']} -> {change['to']} ({change['reason']}), at {change['phase']}"
            )
        for entry in item["log"]:
            moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry["at"]))
            print(f"  {moment}  k {entry['from']} -> {entry['to']}  {'ok' if entry['ok'] else 'FAILED'}  "
                  f"{entry['reason']}: {entry['detail']}")  # fmt: skip
    return 0
