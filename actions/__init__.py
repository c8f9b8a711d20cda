"""Actions, one module each, behind the interface in ``actions.base``."""

from __future__ import annotations

from specguard.actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome
from specguard.actions.feature_flag import FeatureFlagAction
from specguard.actions.log import LogAction
from specguard.actions.slack import SlackAction
from specguard.actions.vllm_restart import VllmRestartAction

ACTION_TYPES: dict[str, type[Action]] = {
    cls.type: cls for cls in (LogAction, FeatureFlagAction, SlackAction, VllmRestartAction)
}

# Instances every config has without declaring them.
BUILTIN_INSTANCES: dict[str, dict[str, str]] = {"log": {"type": "log"}}

__all__ = [
    "ACTION_TYPES",
    "BUILTIN_INSTANCES",
    "Action",
    "ActionContext",
    "ActionMemory",
    "ActionParams",
    "Outcome",
]
