"""``python -m specguard.sim``: the simulator without the specguard command."""

from __future__ import annotations

import argparse
import sys

from specguard.sim.cli import add_arguments, parse_args, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m specguard.sim")
    add_arguments(parser)
    return run(parse_args(parser, sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
