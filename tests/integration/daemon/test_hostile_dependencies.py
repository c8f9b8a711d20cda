"""Every dependency an action talks to turns hostile at once, beside a healthy scrape target:
`specguard run` (its own process, a 1 s interval) engages a feature flag through an API that answers
800 MB error pages, tells on-call through a Slack that answers 429 with `Retry-After: inf`, and
restores a second flag only once a canary agrees, on a vLLM whose counters are impossible.

While they are hostile the daemon keeps its schedule, its memory stays bounded, and each failure
shows in /api/status with its reason. When the server turns healthy, every pending action and
notice completes, and exactly once: one engaged write to the flag API, one Slack message, one
restore of the second flag."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_deps import HostileDeps
from tests.integration.daemon.test_hung_dependencies import (
    RULES,
    _read,
    _stop,
    _watch,
    assert_schedule_held,
    busy,
    rule_state,
    sim,
    until,
)
from tests.ports import free_port
from tests.processes import Daemon

__all__ = ["sim"]  # the simulator fixture, shared with the hung-dependencies test

OBSERVE = 15.0  # seconds the daemon is watched while every dependency is hostile
RSS_GROWTH = 50 * 1024 * 1024  # bytes: the peak may grow this much over the daemon's start, no more

# The rules of the hung-dependencies test: `always` fires at once and keeps firing (api_flag,
# oncall); `busy` fires while a request runs, then resolves (file_flag, restored once its canary agrees).


def config(directory: Path, port: int, scrape_url: str, deps: HostileDeps) -> Path:
    (directory / "rules.yaml").write_text(RULES)
    (directory / "slack-token").write_text("xoxb-hostile")
    actions: dict[str, Any] = {
        "api_flag": {
            "type": "feature_flag",
            "http": {"url": deps.url("/flag/spec"), "engage": {"speculative": False},
                     "restore": {"speculative": True}, "request_timeout": "5s", "retries": 1},
            "retry_backoff": "1s", "retry_max_backoff": "2s",
        },
        "file_flag": {
            "type": "feature_flag", "quiet_period": "0s", "restore_backoff": "1s",
            "file": {"path": str(directory / "flag.json"), "engage": {"speculative": False},
                     "restore": {"speculative": True}},
            "canary": {"url": deps.url("/vllm"), "min_acceptance": 0.5, "timeout": "20s"},
        },
        "oncall": {
            "type": "slack", "token": {"file": "slack-token"}, "channel": "C0ONCALL",
            "base_url": deps.url("/slack/api/"), "group_wait": "0s", "backoff": "1s", "max_backoff": "2s",
        },
    }  # fmt: skip
    path = directory / "specguard.yaml"
    path.write_text(
        json.dumps(
            {
                "server": {"port": port},
                "state_dir": "state",
                "interval": "1s",
                "rules": ["rules.yaml"],
                "sources": {"scrape": {"targets": [scrape_url]}},
                "actions": actions,
            }
        )
    )
    return path


def memory_kib(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from /proc")
async def test_hostile_dependencies_hold_no_round_and_every_action_completes_once_they_heal(
    tmp_path: Path, sim: Any
) -> None:
    with HostileDeps() as deps:
        deps.set("/flag", "huge500")  # an 800 MB error page at every write
        deps.set("/slack", "retry_inf")  # 429, Retry-After: inf
        deps.set("/vllm", "canary_absurd")  # accepted tokens grow 10,000 times faster than drafted
        port = free_port()
        daemon = Daemon(config(tmp_path, port, f"{sim.url}/metrics", deps), port, tmp_path / "specguard.log")
        daemon.start()
        try:
            assert daemon.process is not None
            pid = daemon.process.pid
            await daemon.wait_for(lambda s: s.get("last_evaluation") is not None, timeout=60)
            started_kib = memory_kib(pid, "VmRSS")
            async with busy(sim):
                await daemon.wait_for(lambda s: rule_state(s, "busy") == "firing", timeout=60)
                await until(
                    "the flag file engaged", lambda: '"speculative": false' in _read(tmp_path / "flag.json")
                )
            await daemon.wait_for(lambda s: rule_state(s, "busy") != "firing", timeout=60)
            await until("the canary asked", lambda: deps.count("/vllm/metrics") > 0)
            await until("the flag API asked twice", lambda: deps.count("/flag/spec", "PUT") >= 2)
            await until("Slack asked twice", lambda: deps.count("/slack/api/chat.postMessage") >= 2)

            rounds, refused = await _watch(daemon, OBSERVE)
            peak_kib = memory_kib(pid, "VmHWM")
            _, status = await daemon.get("/api/status", timeout=10)
            assert sum(deps.served.values()) == 0, "a dependency answered well while it was to be hostile"

            deps.heal()
            await until(
                "the flag API written once healed", lambda: deps.served_count("/flag/spec", "PUT") >= 1
            )
            await until("the Slack notice delivered", lambda: len(deps.messages) >= 1)
            await until("file_flag restored", lambda: '"speculative": true' in _read(tmp_path / "flag.json"))
            await daemon.wait_for(lambda s: _settled(s), timeout=60)
            await asyncio.sleep(3)  # three more rounds: nothing done twice after it settled
            _, healed = await daemon.get("/api/status", timeout=10)
        finally:
            await _stop(daemon)
        flag_writes = [body for path, body in deps.flag_writes if path == "/flag/spec"]
        messages = list(deps.messages)
        canary_models = deps.served_count("/vllm/v1/models")

    # the schedule held while everything was hostile
    assert_schedule_held(daemon, rounds, refused, OBSERVE)
    # memory bounded: 800 MB answers were refused at 1 MiB, not read
    growth = (peak_kib - started_kib) * 1024
    assert growth < RSS_GROWTH, f"the daemon's peak memory grew {growth / 2**20:.0f} MiB"
    print(f"peak memory +{growth / 2**20:.1f} MiB")

    # each failure shown with its reason
    fallbacks = status["fallbacks"]
    assert "max_response_size" in str(fallbacks["api_flag"].get("last_error")), fallbacks["api_flag"]
    assert "impossible" in json.dumps(fallbacks["file_flag"]), fallbacks["file_flag"]
    oncall = status["actions"]["oncall"]["state"]
    assert oncall["backlog"] >= 1 and "429" in str(oncall["last_error"]), oncall

    # healed: each pending thing done, once
    assert flag_writes == [{"speculative": False}], flag_writes
    posts = [m for m in messages if not m.get("thread_ts")]
    replies = [m["text"] for m in messages if m.get("thread_ts")]
    assert len(posts) == 1, messages  # one incident, one thread
    assert len(replies) == len(set(replies)) and all(
        m["thread_ts"] == posts[0]["ts"] for m in messages[1:]
    ), messages
    assert canary_models >= 1
    assert healed["actions"]["oncall"]["state"]["backlog"] == 0
    assert not healed["actions"]["oncall"]["state"]["failing"]
    file_flag = healed["fallbacks"]["file_flag"]
    assert file_flag.get("last_error") is None, file_flag
    restores = [
        line["msg"] for line in daemon.logs() if line.get("msg", "").startswith("action file_flag: restore: ")
    ]
    assert len(restores) == 1 and "speculative decoding restored" in restores[0], restores


def _settled(status: dict[str, Any]) -> bool:
    """Nothing left to do: no notice waiting, no flag between what it is and what it should be."""
    oncall = status["actions"]["oncall"]["state"]
    flags = status["fallbacks"]
    return oncall.get("backlog") == 0 and all(f.get("next_try") is None for f in flags.values())
