"""sd_notify against a real AF_UNIX datagram socket: the messages, their order (nothing of a
reload before the first READY=1, nothing at all after STOPPING=1), the watchdog interval, and the
pings coming from the event loop itself (a blocked loop stops them)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from specguard.daemon import systemd
from specguard.daemon.status import status_line
from tests.notify_socket import notify_socket


def test_notify_reaches_a_path_socket_and_an_abstract_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with notify_socket(tmp_path) as path_socket:
        monkeypatch.setenv("NOTIFY_SOCKET", path_socket.address)
        assert systemd.notify("READY=1", "STATUS=evaluating 6 rules")
        message = path_socket.wait_for("READY=1", timeout=5)
    assert message.fields == {"READY": "1", "STATUS": "evaluating 6 rules"}
    with notify_socket(abstract=f"specguard-test-{time.monotonic_ns()}") as abstract:
        monkeypatch.setenv("NOTIFY_SOCKET", abstract.address)
        notifier = systemd.Notifier()
        notifier.is_ready = True  # a reload is announced only after the start-up
        assert notifier.reloading()
        message = abstract.wait_for("RELOADING=1", timeout=5)
    assert int(message.fields["MONOTONIC_USEC"]) > 0
    assert message.fields["STATUS"] == "reloading the config"


@pytest.mark.parametrize("address", [None, "", "vsock:2:1234", "relative/path"])
def test_without_a_usable_notify_socket_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch, address: str | None
) -> None:
    if address is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert systemd.notify("READY=1") is False


def test_a_socket_that_is_gone_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert systemd.notify("WATCHDOG=1") is False


def test_a_status_line_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with notify_socket(tmp_path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
        systemd.Notifier().status("store failing:\ndisk full\n")
        message = sock.wait_for("STATUS=store failing: disk full", timeout=5)
    assert list(message.fields) == ["STATUS"]


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("60000000", None, 30.0),
        ("400000", "self", 0.2),
        ("400000", "1", None),
        (None, None, None),
        ("x", None, None),
    ],
)
def test_the_watchdog_pings_at_half_of_watchdog_usec_for_this_process_only(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    import os

    for name, value in (
        ("WATCHDOG_USEC", usec),
        ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid),
    ):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert systemd.watchdog_interval() == expected


async def test_the_watchdog_pings_stop_while_the_event_loop_is_blocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    every, blocked = 0.05, 1.0
    with notify_socket(tmp_path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
        pings = asyncio.get_running_loop().create_task(systemd.Notifier().watchdog(every))
        await asyncio.sleep(0.5)
        before = len(sock.having("WATCHDOG=1"))
        began = time.monotonic()
        time.sleep(blocked)  # the loop is stuck: no coroutine runs
        ended = time.monotonic()
        await asyncio.sleep(0.5)
        pings.cancel()
        await asyncio.gather(pings, return_exceptions=True)
        arrivals = [m.monotonic for m in sock.having("WATCHDOG=1")]
    assert before >= 3  # pinging while the loop runs
    # At most the one sent just before the block can arrive during it; then none for a second.
    during = [t for t in arrivals if began < t < ended]
    assert len(during) <= 1, during
    assert len([t for t in arrivals if t >= ended]) >= 3  # and again once it runs


def test_a_reload_before_ready_says_nothing_and_the_first_ready_comes_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with notify_socket(tmp_path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
        notifier = systemd.Notifier()
        assert notifier.status("starting")  # STATUS= is fine while systemd waits
        assert not notifier.reloading()  # systemd would take the reload's READY=1 as the start's
        assert not notifier.reloaded("1 rule; none firing")
        assert notifier.ready("1 rule; none firing")
        assert notifier.reloading()
        assert notifier.reloaded("1 rule; none firing")
        sock.wait_for("READY=1", timeout=5, after=3)
    assert [sorted(m.fields) for m in sock.messages] == [
        ["STATUS"],
        ["READY", "STATUS"],
        ["MONOTONIC_USEC", "RELOADING", "STATUS"],
        ["READY", "STATUS"],
    ]


async def test_after_stopping_nothing_is_sent_not_even_a_ping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with notify_socket(tmp_path) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.address)
        notifier = systemd.Notifier()
        pings = asyncio.get_running_loop().create_task(notifier.watchdog(0.01))
        assert notifier.ready("1 rule; none firing")
        assert notifier.reloading()
        await asyncio.sleep(0.05)
        assert notifier.stopping()
        # What a reload cut short by the stop, and a round that finished during it, would say.
        assert not notifier.reloaded("1 rule; none firing")
        assert not notifier.status("1 rule; firing: low")
        assert not notifier.ready("1 rule; none firing")
        assert not notifier.stopping()  # said once
        # The pinging task ends by itself: it does not wait for a cancel.
        await asyncio.wait_for(pings, timeout=5)
        # A message sent after STOPPING=1 would have arrived by the time this one does: one socket,
        # one sender, datagrams in order.
        systemd.notify("X_END=1")
        sock.wait_for("X_END=1", timeout=5)
    told = [m.fields for m in sock.messages]
    stopping = told.index({"STOPPING": "1", "STATUS": "stopping"})
    assert told[stopping + 1 :] == [{"X_END": "1"}], told
    assert {"WATCHDOG": "1"} in told[:stopping]


def test_the_status_line_names_what_fires_and_what_is_wrong() -> None:
    rows = [
        {"rule": "acceptance_fallback", "state": "firing"},
        {"rule": "acceptance_fallback", "state": "inactive"},
        {"rule": "latency_regression", "state": "pending"},
        {"rule": "memory_pressure", "state": "inactive"},
    ]
    targets: list[dict[str, object]] = [{"state": "up"}, {"state": "down"}, {"state": "warming_up"}]
    assert status_line(rows, targets, None) == (
        "3 rules; firing: acceptance_fallback; 1 pending; 1/3 targets up, 1 warming up"
    )
    quiet = [{"rule": "memory_pressure", "state": "inactive"}]
    assert status_line(quiet, [], "cannot write\n/var/lib/specguard") == (
        "1 rule; none firing; STORE FAILING: cannot write /var/lib/specguard"
    )
