"""How both stores word a refusal, so that an operator reads the same reason whichever store the
fleet runs: who holds the slots, or how much of the budget is spent."""

from __future__ import annotations

from collections.abc import Iterable

from specguard.coordination.base import Budget, Holder
from specguard.rules.durations import format_duration


def oldest_first(holders: Iterable[Holder]) -> tuple[Holder, ...]:
    """The holders in the order they were granted (fencing tokens grow with every grant)."""
    return tuple(sorted(holders, key=lambda h: h.token))


def named(holder: Holder) -> str:
    """``host:action (token 12, for: <incident>)``."""
    incident = f", for: {holder.incident}" if holder.incident else ""
    return f"{holder.owner} (token {holder.token}{incident})"


def full(limit: int, holders: Iterable[Holder]) -> str:
    """``2 of 2 slots held by a:vllm_restart (token 7), b:vllm_restart (token 9)``."""
    held = oldest_first(holders)
    return f"{len(held)} of {limit} slots held by " + ", ".join(named(h) for h in held)


def over_budget(used: int, budget: Budget) -> str:
    """``budget: 6 of 6 in the last 1h``."""
    return f"budget: {used} of {budget.count} in the last {format_duration(budget.window)}"


def contended(attempts: int) -> str:
    return f"contended: the semaphore changed under {attempts} attempts in a row; ask again later"
