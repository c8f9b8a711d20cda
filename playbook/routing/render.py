"""``specguard routing render``: the nginx configuration and its Lua, from the config's ``routing:``.

Four files, written atomically into one directory:

- ``specguard-routing.conf``: for nginx's ``http {}`` context (Debian: include it from
  ``/etc/nginx/conf.d/``): the shared dict that holds the flag and the counters, the Lua set-up, an
  upstream per pool, the log format, the server clients send requests to and the loopback-only
  admin server;
- ``specguard_routing.lua``: the router (shipped with specguard, copied as it is);
- ``specguard-routing.json``: the pools and classes the router reads when nginx starts or reloads;
- ``nginx.conf`` (with ``standalone``): a whole nginx configuration around the include, with its
  pid, logs and temporary files in the same directory, for an nginx of its own (the demo, tests,
  ``specguard check``'s ``nginx -t``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specguard.common.files import write_atomically
from specguard.config.routing import RoutingConfig

CONF, LUA, RULES, MAIN = (
    "specguard-routing.conf",
    "specguard_routing.lua",
    "specguard-routing.json",
    "nginx.conf",
)
DICT_SIZE = "10m"
DEBIAN_MODULES = Path("/usr/lib/nginx/modules")
MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
DEFAULT_ACCESS_LOG = Path("/var/log/nginx/specguard-routing.log")
ADMIN_BODY = 4096


@dataclass(frozen=True)
class Standalone:
    """What a whole ``nginx.conf`` needs beyond the include."""

    modules: Path | None = DEBIAN_MODULES  # where load_module finds the Lua modules; None: built in
    user: str | None = None  # the workers' user (nginx's default: nobody, when started as root)
    workers: int | str = "auto"


def lua_source() -> str:
    return (resources.files("specguard.playbook.routing") / LUA).read_text(encoding="utf-8")


def rules_json(routing: RoutingConfig) -> str:
    """What the Lua reads: the pools, where requests go by default and under the flag, the classes
    with their conditions as ``[op, value]`` pairs, and every field some class tests."""
    data = {
        "pools": sorted(routing.pools),
        "default_pool": routing.default_pool,
        "fallback_pool": routing.fallback_pool,
        "fields": list(routing.fields()),
        "classes": [
            {
                "name": item.name,
                "pool": item.pool,
                "when": [{"field": c.field, "ops": [list(op) for op in c.ops]} for c in item.when],
            }
            for item in routing.classes
        ],
    }
    return json.dumps(data, indent=2) + "\n"


def _quote(value: object) -> str:
    """A value as one nginx token, in double quotes (nginx's escapes: backslash and quote)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def http_conf(routing: RoutingConfig, out: Path, source: str, access_log: Path | None = None) -> str:
    """The ``http {}`` include."""
    log = access_log or routing.access_log or DEFAULT_ACCESS_LOG
    timeout = f"{max(1, round(routing.read_timeout))}s"
    lines = [
        f"# specguard traffic-class routing, written by `specguard routing render` from {source}.",
        "# Do not edit: change the config's `routing:` section and render again, then `nginx -s reload`.",
        f"lua_shared_dict specguard_routing {DICT_SIZE};  # the fallback flag and the counters; kept across reloads",
        f"lua_package_path {_quote(str(out / '?.lua') + ';;')};",
        "init_by_lua_block {",
        f'    require("specguard_routing").init({json.dumps(str(out / RULES))}, {json.dumps(str(routing.flag_file))})',
        "}",
        "",
        "log_format specguard_routing '$remote_addr [$time_local] \"$request\" $status $body_bytes_sent '",
        "                             '$request_time class=$specguard_class pool=$specguard_pool '",
        "                             'upstream=$upstream_addr';",
        "",
    ]
    for name in sorted(routing.pools):
        pool = routing.pools[name]
        lines.append(f"upstream specguard_{name} {{")
        lines += [f"    server {server};" for server in pool.servers]
        if pool.keepalive:
            lines.append(f"    keepalive {pool.keepalive};")
        lines += ["}", ""]
    lines += [
        "server {",
        f"    listen {routing.listen};",
        f"    access_log {_quote(log)} specguard_routing;",
        "    # The router reads the body before it picks a pool: kept whole in memory up to",
        "    # client_body_buffer_size, written to a temporary file beyond it (which the router reads).",
        f"    client_max_body_size {routing.max_body_size};",
        f"    client_body_buffer_size {routing.buffer_size};",
        "    client_body_in_single_buffer on;",
        '    set $specguard_class "-";',
        '    set $specguard_pool "-";',
        '    set $specguard_upstream "";',
        "",
        "    location / {",
        '        access_by_lua_block { require("specguard_routing").route() }',
        '        log_by_lua_block { require("specguard_routing").log() }',
        "        proxy_pass http://$specguard_upstream;",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";  # keepalive to the pool',
        "        proxy_set_header Host $host;",
        "        proxy_buffering off;  # server-sent events pass through token by token",
        "        proxy_cache off;",
        f"        proxy_read_timeout {timeout};",
        f"        proxy_send_timeout {timeout};",
        "        add_header X-Specguard-Class $specguard_class always;",
        "        add_header X-Specguard-Pool $specguard_pool always;",
        "    }",
        "}",
        "",
        "# The flag and the router's metrics: loopback only.",
        "server {",
        f"    listen {routing.admin_listen};",
        "    access_log off;",
        "    allow 127.0.0.0/8;",
        "    allow ::1;",
        "    deny all;",
        f"    client_max_body_size {ADMIN_BODY};",
        f"    client_body_buffer_size {ADMIN_BODY};",
        '    location = /specguard/flag { content_by_lua_block { require("specguard_routing").flag() } }',
        '    location = /specguard/metrics { content_by_lua_block { require("specguard_routing").metrics() } }',
        "    location / { return 404; }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def main_conf(out: Path, options: Standalone) -> str:
    """A whole ``nginx.conf`` around the include, everything it writes under ``out``."""
    lines = [
        "# A whole nginx configuration for specguard's router, written by `specguard routing render",
        "# --standalone`: run it with `nginx -p DIR -c DIR/nginx.conf`.",
    ]
    if options.modules is not None:
        lines += [f"load_module {options.modules / module};" for module in MODULES]
    if options.user is not None:
        lines.append(f"user {options.user};")
    tmp = out / "tmp"
    lines += [
        f"worker_processes {options.workers};",
        f"pid {out / 'nginx.pid'};",
        f"error_log {out / 'logs' / 'error.log'} notice;",
        "events { worker_connections 1024; }",
        "http {",
        "    default_type application/octet-stream;",
        f"    client_body_temp_path {tmp / 'body'};",
        f"    proxy_temp_path {tmp / 'proxy'};",
        f"    fastcgi_temp_path {tmp / 'fastcgi'};",
        f"    uwsgi_temp_path {tmp / 'uwsgi'};",
        f"    scgi_temp_path {tmp / 'scgi'};",
        f"    include {out / CONF};",
        "}",
    ]
    return "\n".join(lines) + "\n"


def nginx_command(binary: str, out: Path, *extra: str) -> list[str]:
    """nginx on the standalone configuration rendered into ``out``: its prefix, ``nginx.conf`` and
    error log there; ``extra``: ``-t``, ``-s reload``, ``-g "daemon off;"``..."""
    return [binary, "-p", str(out), "-c", str(out / MAIN), "-e", str(out / "logs" / "error.log"), *extra]


def render(
    routing: RoutingConfig, out: Path, source: str, standalone: Standalone | None = None
) -> list[Path]:
    """Write the files into ``out`` (created); returns their paths."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    access_log = None
    files = {RULES: rules_json(routing), LUA: lua_source()}
    if standalone is not None:
        (out / "logs").mkdir(exist_ok=True)
        (out / "tmp").mkdir(exist_ok=True)
        access_log = routing.access_log or out / "logs" / "access.log"
        files[MAIN] = main_conf(out, standalone)
    files[CONF] = http_conf(routing, out, source, access_log)
    written = []
    for name in (LUA, RULES, CONF, MAIN):
        if name in files:
            write_atomically(out / name, files[name], keep_previous=False)
            written.append(out / name)
    return written
