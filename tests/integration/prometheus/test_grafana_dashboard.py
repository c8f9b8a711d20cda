"""The Grafana dashboard (deploy/grafana/specguard.json): its structure as Grafana reads it, then
every query it makes, sent to a real Prometheus that scrapes the simulator and `specguard run`.

The second part stages what the dashboard is for: a simulated vLLM whose acceptance drops, a daemon
whose rule fires and engages a feature-flag fallback, a baseline file with entries at every level
of precedence, and Prometheus scraping both every second. Once the fallback is engaged, every panel
target, annotation and template-variable query, with Grafana's variables substituted, must be
accepted by Prometheus and return at least one sample. A few values are checked too: the fallback
and k as specguard shows them, and each latency's ratio to the baseline value of the entry that
comes first in specguard's order of precedence among those that have the signal.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.rules.signals import CATALOG, metric_names
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.traffic import Traffic
from tests.ports import free_port
from tests.processes import Daemon
from tests.prometheus_server import PrometheusServer, running_prometheus
from tests.real import require_binary

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "specguard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's own variables (https://grafana.com/docs/grafana/latest/dashboards/variables/add-template-variables/#global-variables)
BUILTIN = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
# $name, ${name} and ${name:format}; $1 in label_replace is PromQL's, not Grafana's.
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::[^}]*)?\}|(\w+))")
VLLM_SELECTOR = '{model_name=~"$model_name", instance=~"$instance"}'
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$", re.S)

DEADLINE = 90.0  # seconds, for each wait: generous on a loaded 2-core machine
MODEL = "tiny-llama"


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


@dataclass(frozen=True)
class Query:
    where: str  # what asks it: "panel 12 (Time to first token p95) B", "variable instance"...
    expr: str  # as written in the dashboard, Grafana's variables in it


def queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every PromQL the dashboard sends: panel targets, annotations, variable queries."""
    found = [
        Query(f"panel {p['id']} ({p['title']}) {t['refId']}", t["expr"])
        for p in panels(dashboard)
        for t in p.get("targets", [])
    ]
    found += [
        Query(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(
                Query(f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query)
            )
    return found


def variable_names(text: str) -> set[str]:
    return {name for match in VARIABLE.finditer(text) if not (name := match[1] or match[2]).isdigit()}


# --- the structure, as Grafana reads it ----------------------------------------------------------


def test_the_dashboard_is_a_current_grafana_model_with_unique_panel_ids_and_no_inputs() -> None:
    dashboard = load_dashboard()
    assert "__inputs" not in dashboard  # provisioned from a file or imported as is
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}"
    kinds = {p["type"] for p in panels(dashboard)}
    assert kinds <= {"row", "timeseries", "stat", "bargauge"}, kinds
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, (panel["id"], grid)
    # The file is kept readable: 2-space indentation, one trailing newline.
    assert DASHBOARD.read_text() == json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def test_every_panel_target_and_annotation_uses_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    (source,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for panel in panels(dashboard):
        assert panel.get("datasource") == DATASOURCE, f"panel {panel['id']} {panel['title']}"
        for target in panel.get("targets", []):
            assert target.get("datasource") == DATASOURCE, f"panel {panel['id']} {target.get('refId')}"
    for annotation in dashboard["annotations"]["list"]:
        assert annotation["datasource"] == DATASOURCE, annotation["name"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_every_target_has_an_expression_and_a_ref_id_unique_in_its_panel() -> None:
    for panel in panels(load_dashboard()):
        if panel["type"] == "row":
            assert not panel.get("targets"), panel["title"]
            continue
        refs = [t.get("refId") for t in panel["targets"]]
        assert refs and all(refs) and len(refs) == len(set(refs)), (panel["id"], refs)
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), (panel["id"], target.get("refId"))


def test_every_variable_the_dashboard_uses_is_defined() -> None:
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "model_name", "instance"} <= defined
    for variable in dashboard["templating"]["list"]:
        if variable["name"] in ("model_name", "instance"):
            assert (variable["multi"], variable["includeAll"], variable["allValue"]) == (True, True, ".*")
            assert LABEL_VALUES.match(variable["query"]["query"]), variable["name"]
    used = {
        (query.where, name)
        for query in queries(dashboard)
        for name in variable_names(query.expr) - BUILTIN
        if name not in defined
    }
    assert not used, f"undefined variables: {sorted(used)}"
    datasource_uses = {
        name for p in panels(dashboard) for name in variable_names(json.dumps(p.get("datasource")))
    }
    assert datasource_uses <= defined


def test_every_vllm_metric_is_spelled_as_the_catalog_spells_it_and_filtered_by_model_and_instance() -> None:
    newest = {signal.metric.names[0] for signal in CATALOG.values()} | {
        signal.denominator.names[0] for signal in CATALOG.values() if signal.denominator is not None
    }
    known = metric_names()
    for query in queries(load_dashboard()):
        if query.where.startswith("variable"):
            continue
        for match in re.finditer(r"(vllm:[a-z0-9_:]+)(\{[^}]*\})?", query.expr):
            name, selector = match[1], match[2]
            family = name.removesuffix("_bucket")
            assert family in known and family in newest, f"{query.where}: {name} is not the catalog's name"
            assert selector == VLLM_SELECTOR, f"{query.where}: {name}{selector or ''} is not filtered"


# --- every query against a real Prometheus ------------------------------------------------------


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana writes it into a Prometheus query: each value regex-escaped
    (with the backslash doubled for the PromQL string), several in a group."""
    escaped = [re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m[0], v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, values: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        return match[0] if name.isdigit() else values[name]

    return VARIABLE.sub(one, expr)


def as_promql(query: Query, values: Mapping[str, str]) -> str:
    """What Prometheus is asked: label_values(selector, label) becomes group by (label) (selector)."""
    expr = substitute(query.expr, values)
    variable = LABEL_VALUES.match(expr) if query.where.startswith("variable") else None
    if variable is None:
        return expr
    label = variable["label"]
    selector = variable["selector"] or "{" + label + '!=""}'  # label_values(label): any series with it
    return f"group by ({label}) ({selector})"


async def ask(
    session: aiohttp.ClientSession, prometheus: PrometheusServer, expr: str, at: float | None = None
) -> Any:
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    async with session.get(f"{prometheus.url}/api/v1/query", params=params) as response:
        body = await response.json(content_type=None)
    if body.get("status") != "success":
        pytest.fail(f"Prometheus refused {expr!r}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


async def all_answer(
    session: aiohttp.ClientSession, prometheus: PrometheusServer, asked: dict[str, str]
) -> None:
    """Until every expression returns a sample; a refused one fails at once, an empty one at the
    deadline (a rate needs two scrapes in its window, a counter its first increment)."""
    waiting = dict(asked)
    last: dict[str, Any] = {}
    deadline = time.monotonic() + DEADLINE
    while waiting:
        for where, expr in list(waiting.items()):
            data = await ask(session, prometheus, expr)
            last[where] = data
            assert data["resultType"] == "vector", f"{where}: {expr!r} gives a {data['resultType']}"
            if data["result"]:
                del waiting[where]
        if not waiting:
            return
        if time.monotonic() > deadline:
            shown = "\n".join(f"{where}: {waiting[where]!r} -> {last[where]}" for where in waiting)
            pytest.fail(f"no sample within {DEADLINE:.0f} s from:\n{shown}")
        await asyncio.sleep(1.0)


async def at_one_instant(
    session: aiohttp.ClientSession, prometheus: PrometheusServer, *exprs: str
) -> list[dict[str, float]]:
    """Each expression's values by instance at one instant (a second ago, so that both see the same
    scrapes), once every one has a finite value there."""
    deadline = time.monotonic() + DEADLINE
    while True:
        at = time.time() - 1
        answers = [await ask(session, prometheus, expr, at) for expr in exprs]
        values = [{s["metric"]["instance"]: float(s["value"][1]) for s in a["result"]} for a in answers]
        if all(v and all(math.isfinite(x) for x in v.values()) for v in values):
            return values
        if time.monotonic() > deadline:
            pytest.fail(f"no finite values within {DEADLINE:.0f} s: {list(zip(exprs, answers, strict=True))}")
        await asyncio.sleep(0.5)


def baseline_file(sim_instance: str) -> dict[str, Any]:
    """One entry per level of precedence, each level holding some signal no more specific entry has,
    and values that differ, so each ratio proves which entry it used."""
    return {
        "version": 2,
        "measured_at": "2026-12-01T00:00:00Z",
        "entries": [
            {"model": MODEL, "instance": sim_instance, "signals": {"ttft_p95": 0.25}},
            {"model": MODEL, "signals": {"ttft_p95": 0.5, "itl_p50": 0.02, "e2e_latency_p95": 2.0}},
            {"instance": sim_instance, "signals": {"ttft_p95": 0.7, "itl_p95": 0.06}},
            {"signals": {"e2e_latency_p50": 1.1, "itl_p95": 0.09, "e2e_latency_p95": 3.0}},
        ],
    }


# The value each latency's ratio uses, from the file above: the most specific entry that has it.
EXPECTED_BASELINE = {
    "ttft_p95": 0.25,  # model and instance
    "itl_p50": 0.02,  # model
    "e2e_latency_p95": 2.0,  # model, over the default
    "itl_p95": 0.06,  # instance, over the default
    "e2e_latency_p50": 1.1,  # default
}

RULES = """\
rules:
  - name: acceptance_fallback
    signal: acceptance_rate
    window: 5s
    interval: 1s
    condition: "< 0.5"
    severity: critical
    actions: [fallback, log]
"""


def daemon_config(port: int, sim: Simulator, down: int) -> str:
    return json.dumps(
        {
            "server": {"port": port},
            # The second target refuses connections (a server that is down): its scrape errors
            # are what the dashboard's source-error panel shows.
            "sources": {
                "scrape": {
                    "targets": [f"{sim.url}/metrics", f"http://127.0.0.1:{down}/metrics"],
                    "timeout": "2s",
                }
            },
            "state_dir": "state",
            "interval": "1s",
            "baseline": "baseline.json",
            "rules": ["rules.yaml"],
            "actions": {
                "fallback": {
                    "type": "feature_flag",
                    "quiet_period": "10m",
                    "file": {
                        "path": "router/flags.json",
                        "engage": {"speculative": False},
                        "restore": {"speculative": True},
                    },
                },
                # On no rule: never run, it shows k from the file vLLM is started with.
                "fewer-tokens": {
                    "type": "vllm_restart",
                    "ladder": [4, 2, 0],
                    "url": sim.url,
                    "env_file": {"path": "vllm/speculative.env"},
                    "command": ["true"],
                },
            },
        },
        indent=2,
    )


def flag_engaged(directory: Path) -> bool:
    path = directory / "router" / "flags.json"
    return path.exists() and json.loads(path.read_text()) == {"speculative": False}


@pytest.mark.real
async def test_every_dashboard_query_returns_samples_from_a_real_prometheus_scraping_the_simulator_and_specguard(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    require_binary("prometheus", "prometheus")  # before anything is started
    dashboard = load_dashboard()
    k = 4
    sim = await start_simulator(
        SimOptions(
            port=0,
            step_time=0.004,
            seed=7,
            speculative=SpeculativeConfig(method="draft_model", model="tiny-draft", num_speculative_tokens=k),
            acceptance_by_position=[0.9],  # vLLM's acceptance rate about 0.77 at k = 4
        )
    )
    traffic = Traffic(sim.url, MODEL, concurrency=4, max_tokens=48)
    await traffic.start()
    sim_instance = sim.url.removeprefix("http://")
    ports = {name: free_port() for name in ("specguard", "prometheus", "down")}
    (tmp_path / "router").mkdir()
    (tmp_path / "vllm").mkdir()
    spec = json.dumps({"method": "draft_model", "model": "tiny-draft", "num_speculative_tokens": k})
    (tmp_path / "vllm" / "speculative.env").write_text(f"VLLM_SPECULATIVE_CONFIG='{spec}'\n")
    (tmp_path / "baseline.json").write_text(json.dumps(baseline_file(sim_instance)))
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "specguard.yaml").write_text(daemon_config(ports["specguard"], sim, ports["down"]))
    daemon = Daemon(tmp_path / "specguard.yaml", ports["specguard"], tmp_path / "specguard.log")
    daemons.append(daemon)
    jobs = {"vllm": [sim_instance], "specguard": [f"127.0.0.1:{ports['specguard']}"]}
    try:
        async with (
            running_prometheus(jobs, tmp_path, ports["prometheus"]) as prometheus,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session,
        ):
            daemon.start()
            await daemon.wait_for(lambda s: any(r["verdict"] == "ok" for r in s["rules"]), timeout=DEADLINE)
            for engine in sim.engines:  # the draft stops matching the traffic
                engine.set_acceptance(0.1)
            await daemon.wait_for(
                lambda s: any(
                    r["rule"] == "acceptance_fallback" and r["state"] == "firing" for r in s["rules"]
                ),
                timeout=DEADLINE,
            )
            deadline = time.monotonic() + DEADLINE
            while not flag_engaged(tmp_path):
                assert time.monotonic() < deadline, (
                    f"the flag file was never engaged\n{daemon.log.read_text()[-3000:]}"
                )
                await asyncio.sleep(0.2)

            all_values = {"model_name": ".*", "instance": ".*", "specguard": ".*"}
            picked = {
                "model_name": grafana_regex([MODEL]),
                "instance": grafana_regex([sim_instance]),
                "specguard": grafana_regex([f"127.0.0.1:{ports['specguard']}"]),
            }
            grafana = {"__rate_interval": "15s", "__interval": "15s", "__range": "1m", "__range_s": "60"}
            for values in (all_values, picked):  # "All", then one of each chosen
                asked = {q.where: as_promql(q, {**grafana, **values}) for q in queries(dashboard)}
                await all_answer(session, prometheus, asked)

            # What the panels show of specguard's own state (Prometheus has scraped the engaged
            # fallback: the annotation's `== 1` answered above).
            shown = {q.where: q for q in queries(dashboard)}
            fallback = await ask(session, prometheus, 'specguard_fallback_engaged{action="fallback"}')
            assert [float(s["value"][1]) for s in fallback["result"]] == [1.0]
            tokens = await ask(session, prometheus, 'specguard_speculative_tokens{action="fewer-tokens"}')
            assert [float(s["value"][1]) for s in tokens["result"]] == [k]
            (positions,) = [q for where, q in shown.items() if "Draft positions" in where]
            counted = await ask(session, prometheus, as_promql(positions, {**grafana, **all_values}))
            assert [float(s["value"][1]) for s in counted["result"]] == [k]

            # Each latency over its baseline value, at one instant.
            (ratio_panel,) = [p for p in panels(dashboard) if p["title"] == "Latency over its baseline"]
            for target in ratio_panel["targets"]:
                (signal,) = set(re.findall(r'signal="(\w+)"', target["expr"]))
                latency, ratio = await at_one_instant(
                    session,
                    prometheus,
                    CATALOG[signal].promql(15, ["model_name", "instance"]),  # the catalog's own PromQL
                    substitute(target["expr"], {**grafana, **all_values}),
                )
                assert ratio.keys() == latency.keys() == {sim_instance}, (signal, ratio, latency)
                expected = latency[sim_instance] / EXPECTED_BASELINE[signal]
                assert ratio[sim_instance] == pytest.approx(expected, rel=1e-9), signal
    finally:
        await traffic.stop()
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        await sim.stop()
