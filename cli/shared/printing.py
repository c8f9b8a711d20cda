"""What the commands print the same way: a configuration's problems (stderr, in file and line
order), and tables in aligned columns."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any


def print_problems(loaded: Any) -> None:
    for problem in sorted(loaded.problems, key=lambda p: (p.file, p.line or 0)):
        print(problem, file=sys.stderr)


def print_columns(table: Sequence[Sequence[str]], below: Mapping[int, Sequence[str]] | None = None) -> None:
    """Rows of cells in aligned columns, the first row the header; ``below[i]``: lines printed
    under row i, from the second column on."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for index, row in enumerate(table):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        for line in (below or {}).get(index, ()):
            print(" " * (widths[0] + 2) + line)
