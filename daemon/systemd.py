"""sd_notify(3) without a dependency: READY, RELOADING, STOPPING, STATUS and the watchdog.

The protocol is one AF_UNIX datagram per message to ``$NOTIFY_SOCKET`` (a leading ``@`` is the
abstract namespace), ``KEY=VALUE`` lines; systemd calls it stable. Outside systemd every call is a
no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time


def notify(*lines: str) -> bool:
    """Send ``KEY=VALUE`` lines to systemd. A no-op (False) when not run by systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(lines).encode())
    except OSError:
        return False
    return True


def one_line(text: str) -> str:
    """``systemctl status`` shows STATUS= on one line; a newline would end the field."""
    return " ".join(text.split())


class Notifier:
    """What the daemon tells systemd, in the only order the protocol allows.

    systemd takes a Type=notify unit as started at its first READY=1: before it, a reload has
    nothing to announce (RELOADING=1 and the READY=1 that ends a reload would end the start-up
    early). After STOPPING=1 the unit is going down: a READY=1 from a reload the stop cut short, or a
    STATUS= from a round that finished during the stop, would describe a daemon that is no longer
    there, and systemd has stopped watching the watchdog. So before READY=1 only STATUS= and pings
    go out, and after STOPPING=1 nothing at all.
    """

    def __init__(self) -> None:
        self.is_ready = False  # READY=1 sent: start-up is over
        self.is_stopping = False  # STOPPING=1 sent: nothing more is said

    def ready(self, status: str) -> bool:
        """The first READY=1: serving and judging."""
        if self.is_stopping:
            return False
        self.is_ready = True
        return notify("READY=1", "STATUS=" + one_line(status))

    def reloading(self) -> bool:
        if not self.is_ready or self.is_stopping:
            return False
        # MONOTONIC_USEC lets Type=notify-reload (systemd 253+) tell this reload from an earlier one.
        return notify(
            "RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}", "STATUS=reloading the config"
        )

    def reloaded(self, status: str) -> bool:
        """READY=1 again: the reload is over, whether the new config was taken or refused."""
        if not self.is_ready or self.is_stopping:
            return False
        return notify("READY=1", "STATUS=" + one_line(status))

    def status(self, line: str) -> bool:
        """``STATUS=``: one line, as ``systemctl status`` shows it."""
        if self.is_stopping:
            return False
        return notify("STATUS=" + one_line(line))

    def stopping(self) -> bool:
        """STOPPING=1, once; the last message this process sends."""
        if self.is_stopping:
            return False
        self.is_stopping = True
        return notify("STOPPING=1", "STATUS=stopping")

    async def watchdog(self, every: float) -> None:
        """``WATCHDOG=1`` every ``every`` seconds until the stop. It runs on the event loop on
        purpose: a loop that is stuck (a blocking call, a busy coroutine) stops the pings, and
        systemd restarts the daemon once ``WatchdogSec`` passes without one."""
        while not self.is_stopping:
            notify("WATCHDOG=1")
            await asyncio.sleep(every)


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings (half of WatchdogSec), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
