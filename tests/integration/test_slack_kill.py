"""A `specguard run` killed (SIGKILL) while Slack is down, its notice queued and tried: after the
restart, with Slack back, the notice is posted once. The daemon scrapes a simulated vLLM whose
acceptance collapses under hot traffic; Slack is the loopback Web API of tests/slack_api.py."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from sim.options import SimOptions, SpeculativeConfig
from sim.server import start_simulator
from sim.traffic import Traffic
from tests.alert_pipeline import free_port
from tests.processes import Daemon
from tests.slack_api import TOKEN, Fault, running

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
    finally:
        await traffic.stop()
        await sim.stop()
