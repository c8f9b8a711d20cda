"""What the commands that step k through the running daemon share (``ladder``, ``tune``): the
config's ``vllm_restart`` actions, the one a command works on, the daemon's address and how long a
step may take (who asks: ``options.who``)."""

from __future__ import annotations

from typing import Any


class ActionChoice(Exception):
    """No vllm_restart action to work on; the message says why. ``kind``: "none" (the config has
    none), "unknown" (``--action`` names none of them) or "several" (and no ``--action``)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def restart_actions(loaded: Any, wanted: str | None, where: str, why: str = "") -> dict[str, Any]:
    """The config's vllm_restart actions by name, or only ``wanted`` (``--action``). Raises
    ActionChoice when there is none, or ``wanted`` is not one of them."""
    from specguard.actions.vllm_restart import VllmRestartAction

    found = {name: a for name, a in loaded.actions.items() if isinstance(a, VllmRestartAction)}
    if not found:
        raise ActionChoice(f"{where} has no vllm_restart action{why}", "none")
    if wanted is None:
        return found
    if wanted not in found:
        raise ActionChoice(
            f"no vllm_restart action {wanted!r} in {where} (there: {', '.join(sorted(found))})", "unknown"
        )
    return {wanted: found[wanted]}


def one_action(found: dict[str, Any], where: str) -> tuple[str, Any]:
    """The one action of ``found``; ActionChoice ("several") when there are several."""
    if len(found) > 1:
        raise ActionChoice(
            f"several vllm_restart actions in {where} ({', '.join(sorted(found))}): give --action",
            "several",
        )
    ((name, action),) = found.items()
    return name, action


def daemon_url(config: Any) -> str:
    """The running daemon's base URL, from the config's listen address and port (loopback when it
    listens on every address)."""
    host = "127.0.0.1" if config.listen in ("0.0.0.0", "::") else config.listen
    return f"http://{'[' + host + ']' if ':' in host else host}:{config.port}"


def step_wait(action: Any) -> float:
    """How long one step may take: a change and its rollback, each a restart and a health wait."""
    return float(action.p.health_timeout * 2 + action.p.command_timeout * 2 + 300)
