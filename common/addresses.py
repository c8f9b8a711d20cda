"""Network addresses in the config: whether a host is this machine's loopback."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches ``host``: ``localhost`` or a loopback address (an IPv6
    one without its brackets). Any other name may resolve to anything: not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
