"""Checklist item 9 against a real Prometheus that scrapes the simulator and a `specguard run`
daemon and loads the rules `specguard export prometheus-rules` wrote: it passes on that setup, and
fails when a vLLM target is down, when the rules changed since the export Prometheus loaded, when
specguard itself is down, and when the Grafana dashboard misses a signal the rules evaluate or reads
a metric by a name vLLM has dropped."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard import __version__
from specguard.config.loading import load
from specguard.export.prometheus_rules import export_rules
from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.items import prometheus
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import start_simulator
from tests.ports import free_port
from tests.processes import Daemon
from tests.prometheus_server import running_prometheus
from tests.real import require_binary

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "specguard.json"
DEADLINE = 60.0  # seconds for Prometheus to see a change: it scrapes every second

RULES = [
    {"name": "acceptance_low", "signal": "acceptance_rate", "window": "5s", "condition": "< 0.5"},
    {"name": "kv_full", "signal": "kv_cache_usage", "window": "5s", "condition": "> 0.95"},
]
LATENCY = {"name": "latency_high", "signal": "e2e_latency_p95", "window": "5s", "condition": "> 30"}


def write_config(
    directory: Path,
    name: str,
    port: int,
    targets: list[str],
    rules: list[dict[str, Any]],
    preflight: dict[str, Any] | None = None,  # preflight.prometheus
    interval: str = "1s",
    sources: dict[str, Any] | None = None,  # default: scrape ``targets``
) -> Path:
    (directory / f"{name}-rules.yaml").write_text(json.dumps({"rules": rules}))
    path = directory / f"{name}.yaml"
    config = {
        "server": {"port": port},
        "sources": sources or {"scrape": {"targets": targets, "timeout": "2s"}},
        "state_dir": "state",
        "interval": interval,
        "rules": [f"{name}-rules.yaml"],
        **({"preflight": {"prometheus": preflight}} if preflight else {}),
    }
    path.write_text(json.dumps(config, indent=2))
    return path


async def check(config: Path) -> Answer:
    loaded = load(config)
    assert loaded.ok, [str(p) for p in loaded.errors]
    return await prometheus.check(Context(loaded, config, None, time.time()))


def said(answer: Answer) -> str:
    return "\n".join(answer.evidence)


async def wait_up(url: str, instance: str, value: float) -> None:
    deadline = time.monotonic() + DEADLINE
    seen: Any = None
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(
                f"{url}/api/v1/query", params={"query": f'up{{instance="{instance}"}}'}
            ) as r:
                seen = (await r.json())["data"]["result"]
            if seen and float(seen[0]["value"][1]) == value:
                return
            await asyncio.sleep(0.3)
    pytest.fail(f"up{{instance={instance!r}}} never {value}: {seen}")


@pytest.mark.real
async def test_prometheus_item_against_a_real_prometheus_scraping_the_simulator_and_specguard(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    require_binary("prometheus", "prometheus")
    sim = await start_simulator(
        SimOptions(
            port=0,
            seed=3,
            speculative=SpeculativeConfig(method="draft_model", model="tiny-draft", num_speculative_tokens=3),
        )
    )
    ports = {name: free_port() for name in ("specguard", "prometheus", "down")}
    vllm, down = sim.url.removeprefix("http://"), f"127.0.0.1:{ports['down']}"
    url = f"http://127.0.0.1:{ports['prometheus']}"
    rules_file = tmp_path / "specguard-rules.yml"
    checked = {"url": url, "rules_file": str(rules_file), "grafana_dashboard": str(DASHBOARD)}
    sound = write_config(tmp_path, "sound", ports["specguard"], [f"{sim.url}/metrics"], RULES, checked)
    rules_file.write_text(export_rules(load(sound), __version__).text)
    daemon = Daemon(sound, ports["specguard"], tmp_path / "specguard.log")
    daemons.append(daemon)
    jobs = {"vllm": [vllm, down], "specguard": [f"127.0.0.1:{ports['specguard']}"]}
    try:
        async with running_prometheus(jobs, tmp_path, ports["prometheus"], rule_files=[rules_file]):
            daemon.start()
            await daemon.wait_for(lambda status: bool(status["rules"]), timeout=DEADLINE)
            await wait_up(url, vllm, 1)
            await wait_up(url, f"127.0.0.1:{ports['specguard']}", 1)
            await wait_up(url, down, 0)

            answer = await check(sound)
            assert answer.status is Status.PASS, said(answer)
            text = said(answer)
            assert f"vLLM {sim.url}/metrics: up{{job='vllm', instance='{vllm}'}} = 1 (up)" in text
            assert f"up{{job='specguard', instance='127.0.0.1:{ports['specguard']}'}} = 1 (up)" in text
            assert "group specguard-1s: its 2 alerts loaded" in text
            assert f"rules file {rules_file}: as a fresh export writes it" in text
            assert "the rules' signals on it: acceptance_rate, kv_cache_usage" in text
            assert answer.fix is None

            # A vLLM target that is down.
            targets = [f"{sim.url}/metrics", f"http://{down}/metrics"]
            answer = await check(write_config(tmp_path, "down", ports["specguard"], targets, RULES, checked))
            assert answer.status is Status.FAIL
            assert f"vLLM http://{down}/metrics: up{{job='vllm', instance='{down}'}} = 0 (down: " in said(
                answer
            )
            assert "connection refused" in said(answer)

            # A rule added since the export Prometheus loaded.
            changed = write_config(
                tmp_path, "changed", ports["specguard"], [f"{sim.url}/metrics"], [*RULES, LATENCY], checked
            )
            answer = await check(changed)
            assert answer.status is Status.FAIL
            assert "group specguard-1s (from " in said(answer) and "missing latency_high" in said(answer)
            assert f"rules file {rules_file}: differs from a fresh export (2 alerting rule(s) in it)" in said(
                answer
            )
            assert answer.fix is not None and "specguard export prometheus-rules --config" in answer.fix

            # Rules Prometheus has not loaded at all: evaluated every 2s, they are another group.
            slower = write_config(
                tmp_path, "slower", ports["specguard"], [f"{sim.url}/metrics"], RULES, checked, interval="2s"
            )
            answer = await check(slower)
            assert answer.status is Status.FAIL
            assert "group specguard-2s (2 alerts): not loaded" in said(answer)
            assert "group specguard-1s (from " in said(answer)
            assert "loaded, but a fresh export has no such group" in said(answer)

            # With the Prometheus source, vLLM's servers are the targets of the jobs with vLLM's series.
            through = write_config(
                tmp_path,
                "through",
                ports["specguard"],
                [],
                RULES,
                checked,
                sources={"prometheus": {"url": url}},
            )
            answer = await check(through)
            assert answer.status is Status.FAIL
            assert "vLLM's servers: the targets of job(s) vllm" in said(answer)
            assert f"vLLM (job vllm): up{{instance='{vllm}'}} = 1" in said(answer)
            assert f"vLLM (job vllm): up{{instance='{down}'}} = 0 (down: " in said(answer)

            # specguard itself down.
            daemon.stop()
            await wait_up(url, f"127.0.0.1:{ports['specguard']}", 0)
            answer = await check(sound)
            assert answer.status is Status.FAIL
            assert f"up{{job='specguard', instance='127.0.0.1:{ports['specguard']}'}} = 0 (down: " in said(
                answer
            )
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop()
        await sim.stop()


async def test_prometheus_item_fails_when_prometheus_does_not_answer_and_is_unknown_without_one(
    tmp_path: Path,
) -> None:
    port, nobody = free_port(), f"http://127.0.0.1:{free_port()}"
    dashboard = {"grafana_dashboard": str(DASHBOARD)}
    config = write_config(
        tmp_path, "a", port, ["http://127.0.0.1:8000/metrics"], RULES, {"url": nobody, **dashboard}
    )
    answer = await check(config)
    assert answer.status is Status.FAIL
    assert f"Prometheus {nobody}: {nobody}/api/v1/query: ClientConnectorError" in said(answer)
    answer = await check(
        write_config(tmp_path, "b", port, ["http://127.0.0.1:8000/metrics"], RULES, dashboard)
    )
    assert answer.status is Status.UNKNOWN
    assert "Prometheus: no URL" in said(answer) and "Grafana dashboard " in said(answer)
    assert answer.fix is not None and "preflight.prometheus.url" in answer.fix


def edited(tmp_path: Path, change: Any) -> Path:
    dashboard = json.loads(DASHBOARD.read_text())
    change(dashboard)
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(dashboard))
    return path


async def test_a_dashboard_missing_a_signal_the_rules_evaluate_fails(tmp_path: Path) -> None:
    def drop_kv_cache(dashboard: dict[str, Any]) -> None:
        dashboard["panels"] = [p for p in dashboard["panels"] if "kv_cache_usage" not in json.dumps(p)]

    path = edited(tmp_path, drop_kv_cache)
    config = write_config(tmp_path, "a", free_port(), ["http://127.0.0.1:8000/metrics"], RULES,
                          {"grafana_dashboard": str(path)})  # fmt: skip
    answer = await check(config)
    assert answer.status is Status.FAIL
    assert (
        "no query reads vllm:kv_cache_usage_perc: signal kv_cache_usage, which rule kv_full evaluates"
        in said(answer)
    )


async def test_a_dashboard_reading_metrics_vllm_renamed_or_dropped_fails(tmp_path: Path) -> None:
    def old_names(dashboard: dict[str, Any]) -> None:
        text = json.dumps(dashboard["panels"])
        text = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        text = text.replace(
            "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_draft_acceptance_rate"
        )
        dashboard["panels"] = json.loads(text)
        dashboard["panels"].append(
            {"id": 999, "title": "ours", "targets": [{"expr": "specguard_gone_total"}]}
        )

    path = edited(tmp_path, old_names)
    config = write_config(tmp_path, "a", free_port(), ["http://127.0.0.1:8000/metrics"], RULES,
                          {"grafana_dashboard": str(path)})  # fmt: skip
    text = said(await check(config))
    assert (
        "'KV-cache usage': vllm:gpu_cache_usage_perc is vLLM's old name: now vllm:kv_cache_usage_perc" in text
    )
    assert "vLLM has no vllm:spec_decode_draft_acceptance_rate (not in the signal catalog)" in text
    assert "panel 'ours': the daemon exports no specguard_gone_total" in text


def test_a_prometheus_url_that_is_not_http_is_a_config_error_naming_its_line(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, "a", free_port(), ["http://127.0.0.1:8000/metrics"], RULES, {"url": "prom:9090"}
    )
    (problem,) = load(config).errors
    assert problem.field == "preflight.prometheus.url" and problem.line is not None
    assert "'prom:9090' is not an http(s) URL" in problem.message
