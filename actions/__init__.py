"""Actions, one module each, behind the interface in ``actions.base``."""

from __future__ import annotations

from actions.base import Action, ActionContext, ActionMemory, ActionParams, Outcome
from actions.feature_flag import FeatureFlagAction
from actions.log import LogAction
from actions.slack import SlackAction
from actions.vllm_restart import VllmRestartAction

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
