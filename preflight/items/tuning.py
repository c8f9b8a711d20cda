"""Item 3: k was tuned. ``specguard tune`` recorded a result (``tune_results`` in the state database)
for each running speculative server, and the k it runs (the draft positions its ``/metrics`` counts)
is the recommended one or within the result's margin (a k whose measured speed the sweep could not
tell from the best's). The serving file's k, when there is one, is held to the same result: it is
what the next deploy runs."""

from __future__ import annotations

import time

from specguard.playbook.serve_config.serving import ServingError, load_serving
from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.servers import ServerFacts, describe, down_fix, servers
from specguard.preflight.window import Unreadable, query
from specguard.store import tune_results
from specguard.store.tune_results import TuneResult

NUMBER = 3
KEY = "tuning"
TITLE = "k tuned, and the running k recommended"


def _tune_command(ctx: Context, url: str) -> str:
    config = f"--config {ctx.config_file} " if ctx.config_file else ""
    serving = f" --serving {ctx.loaded.config.serving}" if ctx.loaded.config.serving else ""
    return f"specguard tune {config}--url {url} --sweep 1,3,5{serving} --write"


async def check(ctx: Context) -> Answer:
    store = ctx.store_file
    if store is None or not store.is_file():
        return Answer(Status.UNKNOWN, (f"no state database{f' at {store}' if store else ''}: tune results are "
                                       "kept there (the daemon's state_dir)",))  # fmt: skip
    try:
        results = await query(store, tune_results.latest)
    except Unreadable as exc:
        if "no such table" not in str(exc):
            return Answer(Status.UNKNOWN, (str(exc),))
        results = []  # a database written before specguard kept tune results
    configured = await servers(ctx)
    if not configured:
        return Answer(Status.UNKNOWN, ("the config names no vLLM server to compare with",))
    running = [s for s in configured if s.k != 0]
    if not running:
        return Answer(Status.FAIL, (*map(describe, configured), "no configured server runs speculative decoding"),
                      "deploy the serving file (`specguard serve-config`), then tune k")  # fmt: skip
    evidence: list[str] = []
    fixes: list[str] = []
    for server in running:
        evidence.append(describe(server))
        lines, fix = _judge(ctx, server, results)
        evidence += [f"  {line}" for line in lines]
        if fix:
            fixes.append(fix)
    serving_lines, serving_fix = _serving(ctx, running, results)
    evidence += serving_lines
    if serving_fix:
        fixes.append(serving_fix)
    if fixes:
        return Answer(Status.FAIL, tuple(evidence), "; ".join(dict.fromkeys(fixes)))
    return Answer(Status.PASS, tuple(evidence))


def result_for(server: ServerFacts, results: list[TuneResult]) -> TuneResult | None:
    """The newest result measured at this server's URL, else for its model."""
    by_url = [r for r in results if r.url == server.base_url and (not r.model or r.model == server.model)]
    by_model = [r for r in results if server.model and r.model == server.model]
    found = by_url or by_model
    return found[0] if found else None


def _said(result: TuneResult, now: float) -> str:
    within = ", ".join(map(str, result.acceptable()))
    margin = f"{result.margin:.0%}" if result.margin is not None else "none"
    swept = ",".join(map(str, result.result.get("ks", ())))
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(result.at))
    return (f"tune at {at} ({(now - result.at) / 86400:.1f} days ago) on {result.url}, k {swept} swept: "
            f"recommended k={result.recommended}; within its {margin} margin: k {within}")  # fmt: skip


def _judge(ctx: Context, server: ServerFacts, results: list[TuneResult]) -> tuple[list[str], str | None]:
    if server.k is None:
        return [f"its k could not be read: {'; '.join(server.errors)}"], down_fix(server)
    found = result_for(server, results)
    if found is None:
        return ["no tune result for this server or its model"], _tune_command(ctx, server.base_url)
    lines = [_said(found, ctx.now)]
    if server.k in found.acceptable():
        lines.append(f"runs k={server.k}: " + ("the recommended k" if server.k == found.recommended
                                                 else "within the margin of the recommended k"))  # fmt: skip
        return lines, None
    lines.append(f"runs k={server.k}, not the recommended k={found.recommended} (nor within its margin)")
    return (
        lines,
        f"specguard ladder set {found.recommended}   # or deploy the serving file with k={found.recommended}",
    )


def _serving(
    ctx: Context, running: list[ServerFacts], results: list[TuneResult]
) -> tuple[list[str], str | None]:
    path = ctx.loaded.config.serving
    if path is None:
        return [], None
    try:
        serving = load_serving(path)
    except ServingError as exc:
        return [f"serving file: {line}" for line in str(exc).splitlines()], f"correct {path}"
    names = {serving.served_model_name, serving.target}
    found = next((r for r in results if r.model in names), None)
    if found is None:
        found = next((result_for(s, results) for s in running if result_for(s, results) is not None), None)
    if found is None:
        return [
            f"serving file {path}: k={serving.num_speculative_tokens} (no tune result to hold it to)"
        ], None
    k = serving.num_speculative_tokens
    if k in found.acceptable():
        return [f"serving file {path}: k={k}, as recommended"], None
    return (
        [
            f"serving file {path}: k={k}, not the recommended k={found.recommended}: the next deploy would run it"
        ],
        f"set num_speculative_tokens: {found.recommended} in {path} (`specguard tune ... --write` does)",
    )
