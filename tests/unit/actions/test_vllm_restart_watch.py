"""What vllm_restart reads of the restarted server's process while it waits for /health: systemd's
record of the unit, or the status command's exit status; and the wait ending on it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specguard.actions.vllm_restart.process import StatusCommandWatch, UnitWatch, unit_down, unit_properties
from specguard.actions.vllm_restart.server import NotReady, Server, ServerDown
from tests.ports import free_port

RUNNING = {"ActiveState": "active", "SubState": "running", "Result": "success", "ExecMainStatus": "0"}


def test_systemctl_show_lines_are_read_as_properties() -> None:
    text = "ActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainStatus=1\nNRestarts=0\n\n"
    assert unit_properties(text) == {
        "ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": "1",
        "NRestarts": "0",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("properties", "down"),
    [
        (RUNNING, None),
        ({**RUNNING, "ActiveState": "activating", "SubState": "start"}, None),  # Type=notify, loading
        (
            {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": "1"},
            "vllm.service failed (Result=exit-code, status 1)",
        ),
        (
            {"ActiveState": "failed", "SubState": "failed", "Result": "signal", "ExecMainStatus": "9"},
            "vllm.service failed (Result=signal, signal 9)",
        ),
        (
            {
                "ActiveState": "failed",
                "SubState": "failed",
                "Result": "start-limit-hit",
                "ExecMainStatus": "0",
            },
            "vllm.service failed (Result=start-limit-hit)",
        ),
        (  # Restart=on-failure, between two starts (systemd/vllm.service: RestartSec=10)
            {
                "ActiveState": "activating",
                "SubState": "auto-restart",
                "Result": "exit-code",
                "ExecMainStatus": "1",
            },
            "vllm.service failed (Result=exit-code, status 1); systemd is to start it again (Restart=)",
        ),
        (
            {"ActiveState": "inactive", "SubState": "dead", "Result": "success", "ExecMainStatus": "0"},
            "vllm.service is inactive (Result=success)",
        ),
    ],
)
def test_a_unit_is_down_once_failed_inactive_or_awaiting_its_automatic_restart(
    properties: dict[str, str], down: str | None
) -> None:
    assert unit_down("vllm.service", properties, 0) == down


def test_a_unit_started_again_by_systemd_since_the_watch_began_is_down_even_if_running_now() -> None:
    # A short RestartSec= may leave the failed state too brief to be seen between two looks.
    assert unit_down("vllm.service", {**RUNNING, "NRestarts": "3"}, 3) is None
    assert (
        unit_down("vllm.service", {**RUNNING, "NRestarts": "4"}, 3)
        == "vllm.service failed and systemd started it again (NRestarts 3 -> 4)"
    )
    assert unit_down("vllm.service", {**RUNNING, "NRestarts": "4"}, None) is None  # no NRestarts before


async def test_the_status_command_says_down_with_its_output_or_its_exit_status() -> None:
    assert await StatusCommandWatch(["sh", "-c", "echo running; exit 0"])() is None
    said = await StatusCommandWatch(["sh", "-c", "echo exited with status 1; echo after 3s; exit 1"])()
    assert said == "the server is down (status_command: exited with status 1; after 3s)"
    assert (
        await StatusCommandWatch(["sh", "-c", "exit 3"])()
        == "the server is down (status_command: exit status 3)"
    )


async def test_a_watch_that_cannot_look_tells_nothing_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "specguard.action.vllm_restart")
    missing = StatusCommandWatch([str(tmp_path / "no-such-command")])
    assert await missing() is None and await missing() is None
    monkeypatch.setenv("PATH", str(tmp_path))  # no systemctl
    unit = UnitWatch("vllm.service")
    assert await unit() is None and await unit() is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert warned[0].startswith("status_command ") and "waiting for /health alone" in warned[0]
    assert warned[1].startswith("cannot read vllm.service's state (FileNotFoundError")


async def test_the_wait_for_health_ends_as_soon_as_the_watch_says_the_server_is_down() -> None:
    server = Server(f"http://127.0.0.1:{free_port()}", None)  # nothing listens: refused, as loading
    looks = 0

    async def watch() -> str | None:
        nonlocal looks
        looks += 1
        return "vllm.service failed (Result=exit-code)" if looks == 3 else None

    with pytest.raises(ServerDown, match=r"^vllm.service failed \(Result=exit-code\)$"):
        await server.wait_healthy(600, poll=0.01, watch=watch)
    assert looks == 3  # a look after each unanswered poll, the third one the last
    with pytest.raises(NotReady, match=r"not healthy within 0\.05s") as raised:
        await server.wait_healthy(0.05, poll=0.01, watch=None)
    assert not isinstance(raised.value, ServerDown)
