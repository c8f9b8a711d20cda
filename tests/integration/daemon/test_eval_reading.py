"""`specguard eval` is a fresh reading, and says so: after traffic stopped, a reading over its
short gap finds no data where the running daemon, over the rule's whole window, has a value, and
the output says why and points to `specguard status`, which shows the daemon's value; with
`--window-from-rule` it samples for the rule's own window."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from tests.processes import specguard
from tests.replay import ReplayedVllm

RULES = """\
rules:
  - name: acceptance_watch
    signal: acceptance_rate
    window: {window}
    condition: "< 0.7"
"""


class Vllm:
    """A replayed vLLM whose traffic can stop: its counters then stand still."""

    def __init__(self) -> None:
        self.replay = ReplayedVllm()
        self.serving = True
        self.page = self.replay()
        self.scrapes = 0

    def __call__(self) -> str:
        self.scrapes += 1
        if self.serving:
            self.page = self.replay()
        return self.page


async def served(aiohttp_server: AiohttpServer, vllm: Vllm) -> str:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=vllm(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}/metrics"


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(1500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out: {what}")


async def test_after_traffic_stops_eval_says_its_short_reading_is_not_the_daemons_view(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    vllm = Vllm()
    url = await served(aiohttp_server, vllm)
    (tmp_path / "rules.yaml").write_text(RULES.format(window="30s"))
    config = tmp_path / "specguard.yaml"
    config.write_text(f"server: {{port: 0}}\nstate_dir: state\ninterval: 200ms\nrules: [rules.yaml]\n"
                      f"sources: {{scrape: {{targets: ['{url}']}}}}\n")  # fmt: skip
    loaded = load(config)
    assert loaded.ok, loaded.problems
    daemon = Daemon(loaded, config)
    await daemon.start(handle_signals=False)
    try:

        def value() -> float | None:
            rows = [r for r in daemon.status()["rules"] if r["rule"] == "acceptance_watch"]
            return rows[0]["value"] if rows else None

        await until(lambda: value() is not None, "the daemon has a value")
        vllm.serving = False  # the traffic stops; the daemon's window still holds it

        code, out, err = await specguard(
            "eval", "--config", str(config), "--sample-gap", "0.5", "--format", "json"
        )
        assert code == 0, err
        (row,) = json.loads(out)
        assert (row["verdict"], row["window"]) == ("no_data", 30.0)
        assert 0.4 < row["over"] < 2  # its two scrapes' gap, not the window
        assert row["note"].startswith("no data in the ") and row["note"].endswith(
            " sampled; the daemon reads 30s"
        )
        assert err.startswith("A fresh reading, not the daemon's: two scrapes ")  # stdout stays JSON

        code, out, err = await specguard("eval", "--config", str(config), "--sample-gap", "0.5")
        assert code == 0, err
        assert out.startswith("A fresh reading, not the daemon's: two scrapes ")
        table = out.split("\n\n", 1)[1]
        words = table.splitlines()[1].split()
        assert words[-6:-4] == ["no_data", "inactive"] and words[-3:] == [
            "of",
            "30s",
            "schedule",
        ]  # OVER: "503ms of 30s"
        tail = " ".join(table.splitlines()[2:])
        assert (
            tail.startswith("No data in the ")
            and "sampled for acceptance_watch (30s): the daemon reads" in tail
        )
        assert "`specguard status` shows its values; --window-from-rule samples that long." in tail

        code, out, err = await specguard("status", "--url", f"http://127.0.0.1:{daemon.port}")
        assert code == 0, err
        rules = out.splitlines()
        line = rules[rules.index("Rules (1, 1 firing, 0 pending)") + 2].split()
        assert line[0] == "acceptance_watch" and line[-4:] == ["0.6", "0.7", "breach", "30s"]
    finally:
        await daemon.shutdown()


async def test_window_from_rule_samples_for_the_rules_own_window(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    vllm = Vllm()
    url = await served(aiohttp_server, vllm)
    (tmp_path / "rules.yaml").write_text(RULES.format(window="3s"))
    config = tmp_path / "specguard.yaml"
    config.write_text("interval: 1s\nrules: [rules.yaml]\n")
    args = ("eval", "--config", str(config), "--scrape", url, "--format", "json")

    code, out, err = await specguard(*args, "--window-from-rule")
    assert code == 0, err
    assert "specguard eval: sampling for 3s, the window of acceptance_watch (a scrape every 1s)" in err
    assert "scrapes over " in err and "(the window of acceptance_watch)" in err
    (row,) = json.loads(out)
    assert 1.5 <= row["over"] <= 3.0 and row["window"] == 3.0  # the window, less a scrape's time at most half
    assert row["value"] == pytest.approx(0.6) and row["verdict"] == "breach" and row["note"] is None
    assert vllm.scrapes >= 3  # as often as the daemon would: a gauge's average has samples across the window

    code, out, err = await specguard(*args, "--sample-gap", "0.2")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["over"] < 1.0 and row["value"] == pytest.approx(
        0.6
    )  # the same traffic over a fifth of a second
