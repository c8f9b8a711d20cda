"""The stack a fallback drill runs against in the tests, as the demo builds it: a speculative
server and a standard one behind specguard's real nginx router, the ``feature_flag`` action's
``nginx`` backend setting the router's flag, a canary on the speculative server, and the state
database; the config written as an operator would, and item 7 of the checklist run on it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from specguard.config.loading import Loaded, load
from specguard.preflight.item import Answer, Context
from specguard.preflight.items import drill as item
from tests.nginx_router import Router, routing_config
from tests.statedb import query

RULE = "acceptance_low"
RULES = (
    f'rules:\n  - name: {RULE}\n    signal: acceptance_rate\n    condition: "< 0.4"\n    window: 10s\n'
    "    severity: critical\n    actions: [fallback]\n"
)


@dataclass
class DrillStack:
    directory: Path
    speculative_url: str  # http://host:port of the speculative server (the canary's)
    standard_port: int
    router: Router
    routing: dict[str, Any]

    @property
    def config(self) -> Path:
        return self.directory / "specguard.yaml"

    @property
    def db(self) -> Path:
        return self.directory / "state" / "specguard.db"

    @property
    def flag_file(self) -> Path:
        return Path(self.routing["flag_file"])

    def nginx(self, **extra: Any) -> dict[str, Any]:
        return {
            "admin_url": self.router.admin_url,
            "flag_file": str(self.flag_file),
            "backoff": "100ms",
            **extra,
        }

    def write(
        self,
        backend: dict[str, Any] | None = None,
        canary: dict[str, Any] | None = None,
        drill: dict[str, Any] | None = None,
        with_canary: bool = True,
        rule_actions: str = "[fallback]",
    ) -> Path:
        """The config: the router's routing section, the fallback action (its backend: the router's
        ``nginx`` by default), its canary, the preflight's drill settings, the rule that names it."""
        backend = backend if backend is not None else {"nginx": self.nginx()}
        canary = canary if canary is not None else {"url": self.speculative_url, "min_acceptance": 0.5,
                                                    "requests": 2, "max_tokens": 32}  # fmt: skip
        action = {"type": "feature_flag", "quiet_period": "1s", **backend}
        if with_canary:
            action["canary"] = canary
        drill = {"probe_requests": 3, "timeout": "5s", **(drill or {})}
        (self.directory / "rules.yaml").write_text(RULES.replace("[fallback]", rule_actions))
        self.config.write_text(
            "server: {port: 0}\nstate_dir: state\ninterval: 100ms\nrules: [rules.yaml]\n"
            f"routing: {json.dumps(self.routing)}\n"
            f"actions:\n  fallback: {json.dumps(action)}\n"
            f"preflight:\n  drill: {json.dumps(drill)}\n"
        )
        return self.config

    def loaded(self) -> Loaded:
        loaded = load(self.config)
        assert loaded.ok, loaded.problems
        return loaded

    def context(self, drill: bool = True, now: float | None = None, loaded: Loaded | None = None) -> Context:
        loaded = loaded or self.loaded()
        store = loaded.config.store_file()
        return Context(
            loaded,
            self.config,
            store if store.is_file() else None,
            time.time() if now is None else now,
            drill=drill,
        )

    async def check(
        self, drill: bool = True, now: float | None = None, loaded: Loaded | None = None
    ) -> Answer:
        return await item.check(self.context(drill, now, loaded))

    async def admin(self, method: str = "GET", body: Any = None) -> dict[str, Any]:
        url = f"{self.router.admin_url}/specguard/flag"
        async with aiohttp.ClientSession() as session, session.request(method, url, json=body) as answer:
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())

    async def engaged(self) -> bool:
        return bool((await self.admin())["fallback"])

    def flag_file_says(self) -> Any:
        return json.loads(self.flag_file.read_text()) if self.flag_file.exists() else None

    def drills(self) -> list[dict[str, Any]]:
        rows = query(self.db, "SELECT * FROM drills ORDER BY id")
        for row in rows:
            row["evidence"] = json.loads(row["evidence"])
        return rows

    def memory(self, key: str) -> dict[str, Any]:
        rows = query(self.db, "SELECT value FROM action_memory WHERE action = 'fallback' AND key = ?", key)
        return dict(json.loads(rows[0]["value"])) if rows else {}


@contextlib.asynccontextmanager
async def drill_stack(directory: Path, speculative: str, standard: str) -> AsyncIterator[DrillStack]:
    """nginx in front of ``speculative`` and ``standard`` (host:port each), its flag off."""
    flag = directory / "routing-flag.json"
    routing = routing_config(speculative, standard, flag)
    router = Router(directory / "nginx", routing)
    await asyncio.to_thread(router.start)
    try:
        yield DrillStack(directory, f"http://{speculative}", int(standard.rsplit(":", 1)[1]), router, routing)
    finally:
        await asyncio.to_thread(router.stop)
