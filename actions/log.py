"""The ``log`` action: write the event to specguard's log (journald under systemd)."""

from __future__ import annotations

import logging
from typing import Literal

from specguard.actions.base import Action, ActionContext, ActionParams, Outcome

log = logging.getLogger("specguard.action.log")

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class LogParams(ActionParams):
    type: Literal["log"] = "log"
    level: Literal["debug", "info", "warning", "error"] | None = None  # None: from the severity


class LogAction(Action):
    type = "log"
    Params = LogParams

    async def run(self, ctx: ActionContext) -> Outcome:
        assert isinstance(self.params, LogParams)
        level = self.params.level or ("warning" if ctx.severity != "info" else "info")
        if ctx.event == "resolved":
            level = self.params.level or "info"
        log.log(
            _LEVELS[level],
            "%s %s: %s",
            ctx.rule,
            ctx.event,
            ctx.summary,
            extra={
                "rule": ctx.rule,
                "event": ctx.event,
                "severity": ctx.severity,
                "labels": dict(ctx.labels),
                "value": ctx.value,
                "threshold": ctx.threshold,
            },
        )
        return Outcome(True, f"logged at {level}")
