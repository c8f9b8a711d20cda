"""Free loopback ports for the servers a benchmark starts."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on now (all bound at once, so none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    for each in sockets:
        each.bind(("127.0.0.1", 0))
    ports = [each.getsockname()[1] for each in sockets]
    for each in sockets:
        each.close()
    return ports
