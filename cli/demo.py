"""``specguard demo``: specguard end to end against a simulated vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="see specguard work end to end against a simulated vLLM (about a minute)",
        description="Start a simulated vLLM with speculative decoding, a standard-decoding one, a router, "
        "a Slack Web API on loopback and the specguard daemon; drive traffic, then degrade acceptance: "
        "the fallback rule fires, the flag moves traffic to standard decoding, on-call gets a Slack "
        "thread, and once acceptance is back (a canary says so) the flag is restored. The router is "
        "specguard's nginx router (rendered from the demo's routing: section) when nginx, its Lua "
        "module and lua-cjson are installed, else the demo's own, which follows a flag file. Finishes "
        "by itself in about 45 s; Ctrl-C stops it.",
    )
    demo.add_argument("--no-color", dest="color", action="store_false", default=None, help="plain text")
    demo.add_argument("--color", dest="color", action="store_true", help="colour even when not a terminal")
    demo.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the demo's state, log and config go (default: a new temp dir)",
    )
    demo.add_argument(
        "--router",
        choices=("auto", "builtin", "nginx"),
        default="auto",
        help="nginx: specguard's nginx router (exit 2 if nginx cannot run it here); builtin: the demo's "
        "own, which follows a flag file; auto (default): nginx when it can run the router, else builtin",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from specguard.demo.run import main as demo_main

    return demo_main(args.state_dir, args.color, args.router)
