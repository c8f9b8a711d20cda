"""Item 1: the baseline is measured, fresh (younger than ``preflight.baseline_max_age``), and was
measured on what runs now: each running server's model has an entry, written against the vLLM
version the server reports on ``/version``."""

from __future__ import annotations

from datetime import UTC, datetime

from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.servers import ServerFacts, describe, down_fix, servers
from specguard.preflight.window import DAY, period
from specguard.store.baseline import Baseline, Entry

NUMBER = 1
KEY = "baseline"
TITLE = "baseline measured and fresh"


def fix_command(ctx: Context, url: str | None = None) -> str:
    path = ctx.loaded.config.baseline or "baseline.json"
    return f"specguard bench --url {url or 'VLLM_URL'} --against PLAIN_URL --write-baseline {path}"


async def check(ctx: Context) -> Answer:
    config = ctx.loaded.config
    baseline = ctx.loaded.baseline
    if config.baseline is None:
        return Answer(Status.FAIL, ("the config names no baseline file (`baseline:`)",),
                      f"{fix_command(ctx)}   # then set `baseline: baseline.json` in the config")  # fmt: skip
    if baseline is None:  # the config's loading said why; a preflight with a config error stops earlier
        return Answer(Status.FAIL, (f"baseline {config.baseline}: cannot be read",), fix_command(ctx))
    running = await servers(ctx)
    if not running:
        return Answer(Status.UNKNOWN, ("the config names no vLLM server to compare the baseline with",))
    evidence: list[str] = []
    failed = False
    fix_url: str | None = None
    max_age = config.preflight.baseline_max_age
    for server in running:
        evidence.append(describe(server))
        problems = _problems(baseline, server, ctx.now, max_age)
        if server.version is None or server.model is None:
            return Answer(Status.FAIL, (*evidence, *problems), down_fix(server))
        if problems:
            failed = True
            fix_url = fix_url or server.base_url
        evidence += [f"  {line}" for line in (problems or _fine(baseline, server))]
    if failed:
        return Answer(Status.FAIL, tuple(evidence), fix_command(ctx, fix_url))
    return Answer(Status.PASS, tuple(evidence))


def _measured_at(baseline: Baseline, entry: Entry) -> datetime | None:
    return entry.measured_at or baseline.data.measured_at


def _version(baseline: Baseline, entry: Entry) -> str | None:
    return entry.vllm_version or baseline.data.vllm_version


def _problems(baseline: Baseline, server: ServerFacts, now: float, max_age: float) -> list[str]:
    if server.errors and (server.version is None or server.model is None):
        return [f"the server did not answer: {'; '.join(server.errors)}"]
    entry = baseline.entry_for(server.labels())
    if isinstance(entry, str):
        return [entry]
    problems = []
    measured = _measured_at(baseline, entry)
    if measured is None:
        problems.append(f"{entry.describe()} does not say when it was measured")
    else:
        age = now - measured.timestamp()
        if age > max_age:
            problems.append(
                f"{entry.describe()} was measured {_age(age)} ago ({_when(measured)}), older than "
                f"preflight.baseline_max_age {period(max_age)}"
            )
    version = _version(baseline, entry)
    if version is None:
        problems.append(f"{entry.describe()} does not say which vLLM it was measured on")
    elif version != server.version:
        problems.append(
            f"{entry.describe()} was measured on vLLM {version}; the server runs {server.version}"
        )
    if entry.model is None:
        problems.append(
            f"the server's model {server.model} has no entry of its own: the default entry was not "
            "measured on it"
        )
    return problems


def _fine(baseline: Baseline, server: ServerFacts) -> list[str]:
    entry = baseline.entry_for(server.labels())
    assert not isinstance(entry, str)
    measured = _measured_at(baseline, entry)
    assert measured is not None
    return [f"{entry.describe()}: measured {_when(measured)} on vLLM {_version(baseline, entry)}"]


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _age(seconds: float) -> str:
    return f"{seconds / DAY:.1f} days" if seconds >= DAY else f"{seconds / 3600:.1f} h"
