"""The Alertmanager configuration that delivers alerts to specguard (``specguard export
alertmanager-receiver``).

specguard's alert rules are fed by Alertmanager's webhook. The receiver has to agree with the
daemon's config on three things an operator easily gets wrong by hand: the URL (listen address,
port and ``server.webhook_path``), the bearer token, and ``send_resolved`` (an alert rule resolves
only when Alertmanager says its alert resolved). This writes a complete config, route and
receiver, that Alertmanager can load as it is, with comments on the token and on merging it into
an existing config.

Facts about Alertmanager it relies on (see docs/prometheus.md): ``timeout`` in a webhook config exists from
Alertmanager 0.28 and older versions refuse the whole file for it, so it is written only when asked
for; a 4xx answer (a wrong token) is dropped, never retried.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import yaml

from specguard.config.loading import Loaded
from specguard.config.schema import ServerConfig
from specguard.rules.durations import format_duration

COMMAND = "specguard export alertmanager-receiver"
RECEIVER = "specguard"
DEFAULT_CREDENTIALS_FILE = "/etc/alertmanager/specguard-token"
DEFAULT_GROUP_WAIT = 30.0
DEFAULT_GROUP_INTERVAL = 300.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0
MAX_ALERTS = 50  # one delivery stays far below the webhook's default 1 MiB body limit
# Addresses that mean "every interface" or a name for loopback: Alertmanager on this host reaches
# the daemon at 127.0.0.1.
_LOCAL_ALIASES = frozenset({"", "0.0.0.0", "::", "localhost"})


@dataclass
class ReceiverExport:
    text: str
    warnings: list[str] = field(default_factory=list)


def webhook_url(server: ServerConfig) -> str:
    """The URL Alertmanager posts to. Raises ValueError when the config cannot tell it."""
    if server.port == 0:
        raise ValueError("server.port is 0 (any free port): the URL is not known in advance; give --url")
    host = "127.0.0.1" if server.listen in _LOCAL_ALIASES else server.listen
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a host name
    return f"http://{host}:{server.port}{server.webhook_path}"


def export_receiver(
    loaded: Loaded,
    version: str,
    *,
    credentials_file: str = DEFAULT_CREDENTIALS_FILE,
    url: str | None = None,
    group_wait: float = DEFAULT_GROUP_WAIT,
    group_interval: float = DEFAULT_GROUP_INTERVAL,
    repeat_interval: float = DEFAULT_REPEAT_INTERVAL,
    timeout: float | None = None,
) -> ReceiverExport:
    """The Alertmanager config (route and receiver) for ``loaded``'s webhook.

    Raises ValueError when the URL cannot be known or a timer is one Alertmanager refuses.
    """
    if group_interval <= 0 or repeat_interval <= 0:
        raise ValueError("group_interval and repeat_interval must be above zero (Alertmanager refuses 0)")
    server = loaded.config.server
    target = url or webhook_url(server)
    warnings: list[str] = []
    token = server.token_ref()
    if token is None:
        warnings.append(
            f"the config sets no server.webhook_token: Alertmanager will still send the token in "
            f"{credentials_file} (and fail every delivery if it cannot read that file); give specguard "
            "the same token (server.webhook_token, e.g. {credential: webhook-token}) so that it checks it"
        )
    if repeat_interval < group_interval:
        warnings.append(
            "repeat_interval is shorter than group_interval: Alertmanager repeats a group at most once "
            "per group_interval"
        )
    webhook: dict[str, Any] = {
        "url": target,
        "send_resolved": True,
        "max_alerts": MAX_ALERTS,
    }
    if timeout is not None:
        webhook["timeout"] = format_duration(timeout)
    webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials_file": credentials_file}}
    route = {
        "receiver": RECEIVER,
        "group_by": ["alertname", "instance"],
        "group_wait": format_duration(group_wait),
        "group_interval": format_duration(group_interval),
        "repeat_interval": format_duration(repeat_interval),
    }
    body = {"route": route, "receivers": [{"name": RECEIVER, "webhook_configs": [webhook]}]}
    where = token.describe() if token is not None else None
    header = _header(loaded, version, target, credentials_file, where, timeout is not None)
    dumped = yaml.safe_dump(body, sort_keys=False, width=2**31 - 1, default_flow_style=False)
    return ReceiverExport(
        "\n".join(f"#{' ' if line else ''}{line}" for line in header) + "\n" + dumped, warnings
    )


def _header(
    loaded: Loaded, version: str, url: str, credentials_file: str, token: str | None, timeout: bool
) -> list[str]:
    source = loaded.config_file if loaded.config_file not in (None, "<defaults>") else "built-in defaults"
    where = f"({token})" if token is not None else "(not set in this config)"
    lines = [
        f"Alertmanager configuration generated by `{COMMAND}`",
        f"from {source} (specguard {version}).",
        f"Every alert goes to specguard's webhook receiver at {url}",
        "(server.listen, port and webhook_path; --url when Alertmanager reaches specguard another way).",
        "",
        f"Token: {credentials_file} must hold the same token as specguard's server.webhook_token",
        f"{where}. specguard answers 401 to any other, and Alertmanager drops a 401 without retrying.",
        "Make the file readable by the user Alertmanager runs as, and by no one else.",
        "send_resolved must stay true: specguard's alert rules resolve when Alertmanager reports their",
        "alert resolved; without it they would stay firing.",
        f"max_alerts: {MAX_ALERTS} keeps one delivery small; the rest of a large group comes in later ones.",
    ]
    if not timeout:
        lines += [
            "Alertmanager 0.28 and later also take `timeout: 10s` in the webhook config (a delivery that",
            "hangs is abandoned); older versions refuse the whole file for it (--timeout adds it).",
        ]
    lines += [
        "",
        "Alertmanager already serves other receivers? Keep your config: append the `specguard` receiver",
        "below to `receivers:` and add a child route for the alerts specguard's rules read, e.g.",
        "  route:",
        "    routes:",
        *_child_routes(loaded),
        "The `continue: true` lets those alerts reach your other routes too.",
        "",
    ]
    return lines


def _child_routes(loaded: Loaded) -> list[str]:
    """Child routes for the alerts the config's rules match (an example when it has none)."""
    matchers = [
        [m.promql() for m in item.rule.alert.matchers]
        for item in loaded.rules
        if item.rule.enabled and item.rule.alert is not None
    ]
    if not matchers:
        matchers = [['alertname=~"VllmDown|GpuMemoryHigh"']]
    out: list[str] = []
    for group in dict.fromkeys(tuple(g) for g in matchers):
        quoted = ", ".join("'" + matcher.replace("'", "''") + "'" for matcher in group)
        out += [f"      - receiver: {RECEIVER}", f"        matchers: [{quoted}]", "        continue: true"]
    return out
