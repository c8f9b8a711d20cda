"""The status page in a real browser (Debian's headless Chromium), served by a daemon in the test's
process that scrapes the simulator under traffic: the page renders, shows the rule firing once
acceptance collapses and resolved once it is back, logs nothing to the console, and screenshots of
it (a desktop's width and a phone's) are kept for a person to look at."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.config.loading import load
from specguard.daemon import page
from specguard.daemon.runtime import Daemon
from specguard.daemon.statusview import build
from specguard.dispatch import silences
from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import Simulator, start_simulator
from specguard.sim.traffic import Traffic
from tests.chromium import ARTIFACTS, PNG, chromium
from tests.real import require_binary

pytestmark = pytest.mark.real

RULES = """\
rules:
  - name: acceptance_collapse
    signal: acceptance_rate
    window: 2s
    condition: "< 0.3"
    severity: critical
    actions: [log]
"""


@pytest.fixture(scope="module")
def browser() -> str:
    return require_binary("chromium", "chromium")


@pytest.fixture
async def serving() -> AsyncIterator[Simulator]:
    """The simulator with a draft model accepted at 0.9 per position, under steady traffic."""
    sim = await start_simulator(
        SimOptions(port=0, step_time=0.004, seed=5, speculative=SpeculativeConfig("draft_model", "tiny-draft", 4),
                   acceptance_by_position=[0.9])
    )  # fmt: skip
    traffic = Traffic(sim.url, sim.options.model, concurrency=2, max_tokens=32)
    await traffic.start()
    yield sim
    await traffic.stop()
    await sim.stop()


async def until(check: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {what}")


def rows(daemon: Daemon) -> list[dict[str, Any]]:
    return [r for r in daemon.status()["rules"] if r["rule"] == "acceptance_collapse"]


def shown_states(dom: str) -> list[str]:
    """The states the page shows for the rule, one per series."""
    return re.findall(r'<tr class="row" data-rule="acceptance_collapse" data-state="(\w+)">', dom)


def headline(dom: str) -> str:
    (h1,) = re.findall(r"<h1>(.*?)</h1>", dom, re.S)
    return re.sub(r"<[^>]+>", "", h1)


async def test_the_page_shows_a_collapse_firing_then_resolved_with_a_quiet_console(
    browser: str, serving: Simulator, tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "token").write_text("page-test-token")
    (tmp_path / "specguard.yaml").write_text(
        "server: {port: 0, webhook_token_file: token}\nstate_dir: state\ninterval: 250ms\nrules: [rules.yaml]\n"
        f"sources: {{scrape: {{targets: ['{serving.url}/metrics']}}}}\n"
    )
    loaded = load(tmp_path / "specguard.yaml")
    assert loaded.ok, loaded.problems
    daemon = Daemon(loaded, tmp_path / "specguard.yaml")
    await daemon.start(handle_signals=False)
    url = f"http://127.0.0.1:{daemon.port}/"
    try:
        await until(lambda: [r["verdict"] for r in rows(daemon)] == ["ok"], "healthy acceptance judged")
        healthy = await chromium(browser, tmp_path / "profile", "--dump-dom", url)
        assert shown_states(healthy.dom) == ["inactive"]
        assert headline(healthy.dom).endswith(": healthy, none firing")
        assert healthy.console == []

        now = time.time()
        await daemon.store.call(
            lambda db: silences.add(
                db, "memory_*", {}, now, now + 7200, "KV cache resize under way", "oncall", now
            )
        )
        serving.engine.set_acceptance([0.05])  # the draft stops matching: acceptance collapses
        await until(lambda: [r["state"] for r in rows(daemon)] == ["firing"], "the rule fires")
        firing = await chromium(browser, tmp_path / "profile", "--dump-dom", url)
        assert shown_states(firing.dom) == ["firing"]
        assert headline(firing.dom).endswith(": healthy, 1 firing")
        assert "KV cache resize under way" in firing.dom and '<a href="/silences/1">' in firing.dom
        assert firing.console == []

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for name, size in (("status-page", "1280,1100"), ("status-page-phone", "390,1600")):
            screenshot = ARTIFACTS / f"{name}.png"
            screenshot.unlink(missing_ok=True)  # what is there afterwards is this run's
            shot = await chromium(browser, tmp_path / "profile", f"--screenshot={screenshot}",
                                  f"--window-size={size}", "--hide-scrollbars", url)  # fmt: skip
            assert shot.console == []
            data = screenshot.read_bytes()
            assert data.startswith(PNG) and len(data) > 10_000, f"{screenshot}: {len(data)} bytes"
        (ARTIFACTS / "status-page.html").write_text(firing.dom, encoding="utf-8")

        serving.engine.set_acceptance([0.9])  # the draft matches again
        await until(lambda: [r["state"] for r in rows(daemon)] == ["resolved"], "the rule resolves")
        resolved = await chromium(browser, tmp_path / "profile", "--dump-dom", url)
        assert shown_states(resolved.dom) == ["resolved"]
        assert headline(resolved.dom).endswith(": healthy, none firing")
        assert resolved.console == []
    finally:
        await daemon.shutdown()


async def test_the_console_check_sees_what_the_pages_policy_blocks(
    browser: str, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """The page with a script and a remote image added, served with the page's own headers: its
    policy blocks both, and Chromium says so on the console, where the test above looks."""
    view = build({"version": "0", "sources": {"targets": []}, "rules": []})
    html = page.status_page(view).replace(
        "</main>", '<script>document.title = "ran"</script><img src="http://127.0.0.1:9/x.png"></main>'
    )

    async def serve(_: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html", headers=page.HEADERS)

    app = web.Application()
    app.router.add_get("/", serve)
    server = await aiohttp_server(app, host="127.0.0.1")
    loaded = await chromium(browser, tmp_path / "profile", "--dump-dom", f"http://127.0.0.1:{server.port}/")
    assert any("Content Security Policy" in line for line in loaded.console), loaded.console
    assert "<title>ran</title>" not in loaded.dom
