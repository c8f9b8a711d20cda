"""Close names for a name that is not known: the "did you mean" of a message about a typo."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_names(name: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """The known names closest to ``name`` (a typo of one of them), best first; none when nothing
    is close."""
    return difflib.get_close_matches(name, sorted(set(known)), n=limit, cutoff=0.6)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean acceptance_low?"`` (or ``... acceptance_low or acceptance_critical?``), or
    nothing when no known name is close."""
    close = close_names(name, known)
    if not close:
        return ""
    return "; did you mean " + " or ".join(close) + "?"
