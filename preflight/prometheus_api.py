"""What item 9 asks Prometheus's HTTP API: ``up`` (``/api/v1/query``), why a target is down
(``/api/v1/targets``) and the alerting rules it has loaded (``/api/v1/rules``). Answers are read
within a size limit; every failure is a ``PrometheusError`` saying which call and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from specguard.common.http import TooLarge, json_limited

TIMEOUT = 15.0
LIMIT = 16 * 2**20  # bytes of an answer
VLLM_JOBS = 'group by (job) ({__name__=~"vllm:.+"})'  # the jobs that scrape vLLM


class PrometheusError(Exception):
    pass


@dataclass(frozen=True)
class Up:
    job: str
    instance: str
    value: float
    error: str = ""  # the target's last scrape error, when it is down


@dataclass(frozen=True)
class LoadedGroup:
    name: str
    file: str
    alerts: tuple[str, ...]
    unhealthy: tuple[str, ...]  # "alert: its lastError" of the rules Prometheus cannot evaluate


class Prometheus:
    def __init__(self, url: str, token: str | None, verify_tls: bool = True) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._verify = verify_tls

    async def _get(self, session: aiohttp.ClientSession, path: str, params: Mapping[str, str]) -> Any:
        where = f"{self.url}{path}"
        try:
            async with session.get(
                where, params=params, headers=self._headers, ssl=self._verify, allow_redirects=False
            ) as response:
                answer = await json_limited(response, LIMIT)
                status = response.status
        except TooLarge as exc:
            raise PrometheusError(f"{path}: {exc}") from None
        except ValueError as exc:
            raise PrometheusError(f"{path}: the answer is not JSON: {exc}"[:300]) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PrometheusError(f"{where}: {type(exc).__name__}: {exc}"[:300]) from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            said = answer.get("error") if isinstance(answer, dict) else None
            raise PrometheusError(f"{path}: HTTP {status}: {said or 'not a success'}"[:300])
        return answer.get("data")

    async def gather(self) -> tuple[list[Up], set[str], list[LoadedGroup]]:
        """Every ``up`` series (with the down ones' errors), the jobs that have vLLM's series, and
        the loaded alerting-rule groups."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
            up = await self._get(session, "/api/v1/query", {"query": "up"})
            jobs = await self._get(session, "/api/v1/query", {"query": VLLM_JOBS})
            targets = await self._get(session, "/api/v1/targets", {"state": "active"})
            rules = await self._get(session, "/api/v1/rules", {"type": "alert"})
        errors: dict[tuple[str, str], str] = {}
        for target in (targets or {}).get("activeTargets") or ():
            labels = target.get("labels") or {}
            errors[(str(labels.get("job")), str(labels.get("instance")))] = str(target.get("lastError") or "")
        series = []
        for item in (up or {}).get("result") or ():
            labels = item.get("metric") or {}
            key = (str(labels.get("job", "")), str(labels.get("instance", "")))
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            series.append(Up(*key, value, errors.get(key, "")))
        groups = []
        for group in (rules or {}).get("groups") or ():
            alerts = [r for r in group.get("rules") or () if r.get("type") == "alerting"]
            groups.append(
                LoadedGroup(
                    str(group.get("name")),
                    str(group.get("file")),
                    tuple(str(r.get("name")) for r in alerts),
                    tuple(
                        f"{r.get('name')}: {r.get('lastError')}" for r in alerts if r.get("health") == "err"
                    ),
                )
            )
        vllm_jobs = {str((i.get("metric") or {}).get("job")) for i in (jobs or {}).get("result") or ()}
        return series, vllm_jobs, groups
