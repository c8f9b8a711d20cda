"""``specguard simulate``: the vLLM-compatible simulator, whose options are its own parser's."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def add_parser(sub: Any) -> None:
    sub.add_parser(
        "simulate",
        add_help=False,
        help="run a vLLM-compatible simulator (OpenAI API + /metrics); see `specguard simulate --help`",
    ).add_argument("simulator_args", nargs=argparse.REMAINDER)


def cmd_simulate(argv: Sequence[str]) -> int:
    # The simulator has its own parser, loaded only here: the daemon never imports it.
    from specguard.sim import cli as sim_cli

    parser = argparse.ArgumentParser(
        prog="specguard simulate",
        description=sim_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim_cli.add_arguments(parser)
    return sim_cli.run(sim_cli.parse_args(parser, argv))
