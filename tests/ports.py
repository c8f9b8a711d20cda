"""Loopback ports for the servers a test starts, taken from below the kernel's ephemeral range.

A port the OS hands out for ``bind(0)`` lies in the ephemeral range, the same range outgoing
connections take their local ports from: between the moment a test learns such a port and the
moment its server binds it, a scrape or an HTTP client may already be using it as a source port
("address already in use", seen on a busy machine). Ports below the range are never given to
outgoing connections; each is checked free by binding it, and none is handed out twice in one
process (a server started later still finds its port free).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOW = 20000
_given: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, not given before."""
    high = _ephemeral_start() - 1
    pick = random.Random(os.getpid() ^ random.getrandbits(32))
    for _ in range(1000):
        port = pick.randint(LOW, high) if high > LOW else 0
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port between {LOW} and {high}")
