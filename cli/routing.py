"""``specguard routing``: the nginx router for traffic classes, from the config's ``routing:``.

``render`` writes the nginx configuration and its Lua; ``classify`` says which class and pool a
request body gets, by the same rules the router applies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specguard.cli.shared.options import add_config

if TYPE_CHECKING:
    from specguard.config.routing import RoutingConfig

RENDER_EPILOG = """\
examples:
  specguard routing render --config /etc/specguard/specguard.yaml --out /etc/nginx/specguard
      then, in /etc/nginx/conf.d/specguard.conf:  include /etc/nginx/specguard/specguard-routing.conf;
      and: nginx -t && nginx -s reload
  specguard routing render --config specguard.yaml --out ./router --standalone
      then: nginx -p ./router -c "$PWD/router/nginx.conf"
"""

CLASSIFY_EPILOG = """\
examples:
  echo '{"model": "m", "prompt": "hi", "max_tokens": 16}' | specguard routing classify --config specguard.yaml
  specguard routing classify --config specguard.yaml --path /v1/chat/completions request.json
"""


def add_parser(sub: Any) -> None:
    routing = sub.add_parser(
        "routing",
        help="the nginx router that sends each traffic class to its pool",
        description="The nginx router of the config's `routing:` section: requests go to the speculative "
        "or the standard pool by what they ask for (temperature, max_tokens, stream...), and all of them "
        "to the fallback pool while the fallback flag is engaged.",
    )
    commands = routing.add_subparsers(dest="routing_command", metavar="COMMAND", required=True)
    render = commands.add_parser(
        "render",
        help="write the nginx configuration and its Lua",
        description="Write the router's files into --out: specguard-routing.conf (for nginx's http {} "
        "context), specguard_routing.lua, specguard-routing.json (the classes) and, with --standalone, "
        "a whole nginx.conf. Files are replaced atomically; reload nginx to use them (the flag is kept "
        "across reloads). Exit 0 when written, 1 for a config with errors, 2 for a usage error.",
        epilog=RENDER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(render)
    render.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write (created)")
    render.add_argument(
        "--standalone",
        action="store_true",
        help="also write nginx.conf: a whole configuration with its pid, logs and temporary files in DIR",
    )
    render.add_argument(
        "--modules",
        metavar="DIR|none",
        default="/usr/lib/nginx/modules",
        help="with --standalone: where load_module finds ndk_http_module.so and ngx_http_lua_module.so "
        "(default: Debian's /usr/lib/nginx/modules); `none` for an nginx with Lua built in (OpenResty)",
    )
    render.add_argument("--user", help="with --standalone: the user nginx's workers run as")
    render.add_argument(
        "--workers", type=int, metavar="N", help="with --standalone: worker processes (default: auto)"
    )
    classify = commands.add_parser(
        "classify",
        help="say which class and pool a request gets",
        description="Read one request body (a file, or stdin) and print the class and pool the router "
        "gives it, and why: the fields it read, a field missing, a body it cannot read.",
        epilog=CLASSIFY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(classify)
    classify.add_argument(
        "body", nargs="?", type=Path, metavar="FILE", help="the request body (default: stdin)"
    )
    classify.add_argument(
        "--path", default="/v1/completions", help="the request's path (default /v1/completions)"
    )
    classify.add_argument("--method", default="POST", help="the request's method (default POST)")
    classify.add_argument("--engaged", action="store_true", help="as while the fallback flag is engaged")
    classify.add_argument("--json", action="store_true", help="print the decision as JSON")


def _routing(args: argparse.Namespace, command: str) -> RoutingConfig | int:
    """The config's routing section, or the exit code after saying why not: 2 without one, 1 for
    a section with errors."""
    from specguard.config.loading import load

    where = f"specguard routing {command}"
    if args.config is None:
        print(
            f"{where}: give --config: the routing classes are the config's `routing:` section",
            file=sys.stderr,
        )
        return 2
    loaded = load(args.config, ())
    errors = [p for p in loaded.errors if p.field.split(".")[0].split("[")[0] in ("routing", "")]
    if errors:
        for problem in sorted(errors, key=lambda p: p.line or 0):
            print(problem, file=sys.stderr)
        print(f"{len(errors)} error(s)", file=sys.stderr)
        return 1
    if loaded.config.routing is None:
        print(
            f"{where}: {args.config} has no `routing:` section (see the routing page of the documentation)",
            file=sys.stderr,
        )
        return 2
    return loaded.config.routing


def cmd_routing(args: argparse.Namespace) -> int:
    routing = _routing(args, args.routing_command)
    if isinstance(routing, int):
        return routing
    if args.routing_command == "render":
        return _render(args, routing)
    return _classify(args, routing)


def _render(args: argparse.Namespace, routing: RoutingConfig) -> int:
    from specguard.playbook.routing.render import Standalone, render

    standalone = None
    if args.standalone:
        modules = None if args.modules == "none" else Path(args.modules)
        if args.workers is not None and args.workers < 1:
            print("specguard routing render: --workers must be 1 or more", file=sys.stderr)
            return 2
        standalone = Standalone(modules=modules, user=args.user, workers=args.workers or "auto")
    elif args.user or args.workers:
        print("specguard routing render: --user and --workers go with --standalone", file=sys.stderr)
        return 2
    try:
        written = render(routing, args.out, str(args.config), standalone)
    except OSError as exc:
        print(
            f"specguard routing render: cannot write into {args.out}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    for path in written:
        print(path)
    classes = ", ".join(f"{c.name} → {c.pool}" for c in routing.classes) or "none"
    print(
        f"{len(routing.classes)} class(es): {classes}; otherwise {routing.default_pool}; "
        f"everything to {routing.fallback_pool} while the flag ({routing.flag_file}) is engaged",
        file=sys.stderr,
    )
    return 0


def _classify(args: argparse.Namespace, routing: RoutingConfig) -> int:
    from specguard.playbook.routing.classify import classify

    try:
        body = args.body.read_bytes() if args.body is not None else sys.stdin.buffer.read()
    except OSError as exc:
        print(f"specguard routing classify: cannot read {args.body}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    decision = classify(routing, args.method, args.path, body, engaged=args.engaged)
    if args.json:
        print(
            json.dumps(
                {
                    "class": decision.klass,
                    "pool": decision.pool,
                    "malformed": decision.malformed,
                    "missing": list(decision.missing),
                    "fallback": decision.fallback,
                }
            )
        )
        return 0
    line = f"class {decision.klass} → pool {decision.pool}"
    if decision.malformed:
        line += f" (malformed: {decision.malformed})"
    if decision.fallback:
        line += " (the fallback flag sends everything there)"
    print(line)
    if decision.missing:
        print(f"missing: {', '.join(decision.missing)} (a condition on a missing field does not hold)")
    return 0
