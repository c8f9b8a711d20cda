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


def reloading() -> bool:
    # MONOTONIC_USEC lets Type=notify-reload (systemd 253+) tell this reload from an earlier one.
    return notify(
        "RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}", "STATUS=reloading the config"
    )


def status(line: str) -> bool:
    """``STATUS=``: one line, as ``systemctl status`` shows it."""
    return notify("STATUS=" + " ".join(line.split()))


async def watchdog(every: float) -> None:
    """``WATCHDOG=1`` every ``every`` seconds, forever. It runs on the event loop on purpose: a loop
    that is stuck (a blocking call, a busy coroutine) stops the pings, and systemd restarts the
    daemon once ``WatchdogSec`` passes without one."""
    while True:
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
