"""What ``specguard eval`` could not read: a rule with no data because its source was unreachable is
not a healthy reading, and the command says so and exits non-zero."""

from __future__ import annotations

from typing import Any

from specguard.common.redact import shown

# A query any Prometheus answers: whether the server can be asked at all.
_PROBE = "vector(1)"


async def unread(source: Any) -> list[str]:
    """One line per target whose last scrape failed (the scrape source), or the Prometheus server's
    failure to answer a trivial query; none when everything was read."""
    if source.kind == "scrape":
        return [f"{shown(target)}: {error}" for target, error in source.last_errors.items()]
    result = await source.query_expr(_PROBE)
    return [result.error] if result.error else []


def message(loaded: Any, lines: list[str]) -> str:
    """``specguard eval: could not read 1 of 2 targets (the rules saw no data from them):`` and a
    line per target."""
    if loaded.config.sources.kind == "scrape":
        total = len(loaded.config.scrape.urls)
        head = (
            f"specguard eval: could not read {len(lines)} of {total} target{'s' if total != 1 else ''} "
            "(the rules saw no data from them):"
        )
    else:
        head = (
            "specguard eval: could not query the Prometheus source (the rules above could not be evaluated):"
        )
    return "\n".join([head, *(f"  {line}" for line in lines)])
