"""What ``specguard tune`` asks of the running daemon, over its HTTP API: the ``vllm_restart``
ladders (``GET /api/ladder``), a step to a rung (``POST /api/ladder/NAME``: the daemon writes the
config, restarts vLLM, verifies the new k and rolls back, and journals it), and the silence that
holds back the rules that would step k themselves while the sweep runs (``/api/silences``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp


class DaemonError(Exception):
    """The daemon does not answer, or refuses; the message says which and why."""


@dataclass(frozen=True)
class Ladder:
    action: str
    k: int
    rungs: tuple[int, ...]
    file: str
    change: dict[str, Any] | None  # a change under way (the daemon's journal)


class DaemonApi:
    """The daemon at ``url`` (``http://127.0.0.1:9100``), with its bearer token when it has one."""

    def __init__(self, url: str, token: str | None, step_timeout: float, who: str) -> None:
        self.url = url.rstrip("/")
        # every write to /api/ is sent as JSON, a DELETE without a body too
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.step_timeout = step_timeout  # a step and its rollback
        self.who = who

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> tuple[int, Any]:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.request(
                    method,
                    self.url + path,
                    data=None if body is None else json.dumps(body),
                    headers=self.headers,
                ) as answer,
            ):
                try:
                    return answer.status, await answer.json(content_type=None)
                except ValueError:
                    return answer.status, {"error": (await answer.text())[:300]}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DaemonError(
                f"the daemon at {self.url} does not answer ({type(exc).__name__}: {exc}); "
                "tune steps k through the running daemon (specguard run)"
            ) from None

    async def ladders(self) -> list[Ladder]:
        status, body = await self._call("GET", "/api/ladder", None, 30)
        if status != 200 or not isinstance(body, dict):
            raise DaemonError(f"the daemon at {self.url} answered {status} to GET /api/ladder: {body}")
        return [
            Ladder(item["action"], int(item["k"]), tuple(item["ladder"]), str(item["file"]), item["change"])
            for item in body.get("ladders", [])
            if isinstance(item.get("k"), int)
        ]

    async def ladder(self, action: str) -> Ladder:
        for found in await self.ladders():
            if found.action == action:
                return found
        raise DaemonError(f"the daemon at {self.url} has no vllm_restart action {action!r} (reloaded?)")

    async def step(self, action: str, k: int) -> str:
        """Step ``action`` to rung ``k``; returns the daemon's detail. Raises DaemonError when the
        step failed (the daemon rolled back, or could not) or was refused."""
        status, body = await self._call(
            "POST", f"/api/ladder/{action}", {"to": k, "who": self.who}, self.step_timeout
        )
        if status != 200 or not isinstance(body, dict):
            error = body.get("error", body) if isinstance(body, dict) else body
            raise DaemonError(f"the daemon refused the step to k={k} ({status}): {error}")
        if not body.get("ok"):
            raise DaemonError(f"the step to k={k} failed: {body.get('detail')}")
        return str(body.get("detail"))

    async def silence(self, rule: str, seconds: float, reason: str) -> int:
        """Add a silence of ``rule`` (a name or a glob) for ``seconds``; returns its id."""
        body = {"rule": rule, "for": f"{max(1, round(seconds))}s", "reason": reason, "author": self.who}
        status, answer = await self._call("POST", "/api/silences", body, 30)
        if status != 201 or not isinstance(answer, dict):
            error = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise DaemonError(f"the daemon refused the silence of {rule} ({status}): {error}")
        return int(answer["silence"]["id"])

    async def expire(self, silence_id: int) -> None:
        status, answer = await self._call("DELETE", f"/api/silences/{silence_id}", None, 30)
        if status not in (200, 404):  # 404: it had ended already
            raise DaemonError(f"the daemon did not expire silence {silence_id} ({status}): {answer}")
