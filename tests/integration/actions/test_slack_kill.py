"""A `specguard run` killed (SIGKILL) while Slack is down, its notice queued and tried: after the
restart, with Slack back, the notice is posted once. The daemon scrapes a simulated vLLM whose
acceptance collapses under hot traffic; Slack is the loopback Web API of sim/slack_api.py."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from specguard.sim.options import SimOptions, SpeculativeConfig
from specguard.sim.server import start_simulator
from specguard.sim.slack_api import TOKEN, Fault, running
from specguard.sim.traffic import Traffic
from tests.ports import free_port
from tests.processes import Daemon

RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    window: 5s
    interval: 1s
    condition: "< 0.5"
    severity: critical
    actions: [oncall]
"""


async def until(what: str, check: object, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {what}")


async def test_a_notice_queued_before_a_kill_is_posted_once_after_the_restart(tmp_path: Path) -> None:
    sim = await start_simulator(
        SimOptions(
            port=0, step_time=0.004, seed=3, speculative=SpeculativeConfig("draft_model", "tiny-draft", 4)
        )
    )
    traffic = Traffic(
        sim.url, sim.options.model, concurrency=4, max_tokens=48, temperature=1.5
    )  # acceptance ~0.04
    await traffic.start()
    try:
        async with running() as slack:
            slack.faults = [Fault("500")] * 10_000  # Slack is down
            port = free_port()
            (tmp_path / "rules.yaml").write_text(RULES)
            (tmp_path / "slack-token").write_text(TOKEN)
            (tmp_path / "specguard.yaml").write_text(
                f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\nrules: [rules.yaml]\n"
                f"sources: {{scrape: {{targets: [{sim.url}/metrics]}}}}\n"
                "actions:\n  oncall:\n    type: slack\n    token: {file: slack-token}\n    channel: C0ONCALL\n"
                f"    base_url: {slack.url}\n    group_wait: 0s\n    backoff: 200ms\n    max_backoff: 500ms\n"
            )
            daemon = Daemon(tmp_path / "specguard.yaml", port, tmp_path / "specguard.log")
            daemon.start()
            try:
                await until("the notice is tried, and tried again", lambda: len(slack.calls) >= 3)
                assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
                assert slack.posted() == []

                slack.faults = []  # Slack is back; specguard starts again
                daemon.start()
                await until("the notice is posted", lambda: len(slack.posted()) >= 1)
                await asyncio.sleep(2.0)  # time enough for a second post, if there were one
            finally:
                if daemon.process is not None and daemon.process.poll() is None:
                    daemon.stop()
            (posted,) = slack.posted()
            assert posted["metadata"]["event_payload"] == {"notice": 1, "action": "oncall"}
            assert posted["blocks"][0]["text"]["text"] == "FIRING · CRITICAL · acceptance_low"
            # before posting again it looked: a try before the kill might have reached Slack
            names = [name for name, _, _ in slack.calls]
            assert names.index("conversations.history") < len(names) - 1
            # history tells it under the firing: the first failed try, then the delivery
            shown = subprocess.run(
                [sys.executable, "-m", "specguard", "history", "--config", str(tmp_path / "specguard.yaml"),
                 "--rule", "acceptance_low", "--format", "json"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            firing = [e for e in json.loads(shown.stdout) if e["kind"] == "firing"]
            assert len(firing) == 1, shown.stdout
            notes = [(n["action"], n["text"]) for n in firing[0]["notes"]]
            assert notes == [
                (
                    "oncall",
                    "notice 1 (post) not delivered yet: chat.postMessage: 500 internal_error; retrying",
                ),
                ("oncall", f"notice 1 posted to C0ONCALL (ts {posted['ts']})"),
            ], notes
            table = subprocess.run(
                [sys.executable, "-m", "specguard", "history", "--config", str(tmp_path / "specguard.yaml")],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert re.search(rf"^ +\d\d:\d\d:\d\d oncall: notice 1 posted to C0ONCALL \(ts {re.escape(posted['ts'])}\)$",
                             table, re.M), table  # fmt: skip
    finally:
        await traffic.stop()
        await sim.stop()
